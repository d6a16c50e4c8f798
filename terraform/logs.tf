# Every log group is created here, KMS-encrypted and with a retention, before
# the service that writes to it; nothing creates log groups on its own.

resource "aws_cloudwatch_log_group" "control_plane" {
  name              = "/${var.name}/${var.environment}/control-plane"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.logs.arn
}

resource "aws_cloudwatch_log_group" "gpu_nodes" {
  name              = "/${var.name}/${var.environment}/gpu-nodes"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.logs.arn
}

resource "aws_cloudwatch_log_group" "flow_logs" {
  name              = "/${var.name}/${var.environment}/vpc-flow-logs"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.logs.arn
}

# RDS writes to fixed names; creating them first sets encryption and retention.
resource "aws_cloudwatch_log_group" "rds" {
  for_each = toset(["postgresql", "upgrade"])

  name              = "/aws/rds/instance/${local.name}/${each.key}"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.logs.arn
}

# WAF requires the aws-waf-logs- prefix.
resource "aws_cloudwatch_log_group" "waf" {
  count = var.enable_waf ? 1 : 0

  name              = "aws-waf-logs-${local.name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.logs.arn
}

# WAF delivers its logs through the CloudWatch Logs delivery service; allow it
# to write to the WAF log group of this account only.
resource "aws_cloudwatch_log_resource_policy" "waf" {
  count = var.enable_waf ? 1 : 0

  policy_name = "${local.name}-waf-logs"
  policy_document = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid       = "WafLogDelivery"
        Effect    = "Allow"
        Principal = { Service = "delivery.logs.amazonaws.com" }
        Action    = ["logs:CreateLogStream", "logs:PutLogEvents"]
        Resource  = "${aws_cloudwatch_log_group.waf[0].arn}:*"
        Condition = {
          StringEquals = { "aws:SourceAccount" = local.account_id }
          ArnLike      = { "aws:SourceArn" = "arn:${local.partition}:logs:${local.region}:${local.account_id}:*" }
        }
      },
    ]
  })
}
