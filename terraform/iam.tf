# Least-privilege roles:
#  - gpu_node:      read the weights bucket (and decrypt it through S3), write
#                   its own log group. Nothing else.
#  - control_plane: read and write the weights bucket, read the database
#                   secret, write its own log group, and publish the Ray head's
#                   address as one record of the private DNS zone.
#  - flow_logs, rds_monitoring: service roles for VPC flow logs and RDS
#                   enhanced monitoring.

data "aws_iam_policy_document" "ec2_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

locals {
  weights_objects_arn = "${aws_s3_bucket.weights.arn}/*"
  db_secret_arn       = aws_db_instance.main.master_user_secret[0].secret_arn
  s3_via_service      = "s3.${local.region}.amazonaws.com"
  ssm_core_policy_arn = "arn:${local.partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"
}

# ---------------------------------------------------------------------------
# GPU nodes
# ---------------------------------------------------------------------------

resource "aws_iam_role" "gpu_node" {
  name_prefix        = "${local.name}-gpu-"
  description        = "thawpool GPU node: read model weights, write logs"
  assume_role_policy = data.aws_iam_policy_document.ec2_assume.json
}

data "aws_iam_policy_document" "gpu_node" {
  statement {
    sid       = "ListWeights"
    actions   = ["s3:ListBucket", "s3:GetBucketLocation"]
    resources = [aws_s3_bucket.weights.arn]
  }

  statement {
    sid       = "ReadWeights"
    actions   = ["s3:GetObject", "s3:GetObjectVersion"]
    resources = [local.weights_objects_arn]
  }

  statement {
    sid       = "DecryptWeightsThroughS3"
    actions   = ["kms:Decrypt"]
    resources = [aws_kms_key.data.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = [local.s3_via_service]
    }
  }

  statement {
    sid = "WriteOwnLogs"
    actions = [
      "logs:CreateLogStream",
      "logs:PutLogEvents",
      "logs:DescribeLogStreams",
    ]
    resources = [
      aws_cloudwatch_log_group.gpu_nodes.arn,
      "${aws_cloudwatch_log_group.gpu_nodes.arn}:log-stream:*",
    ]
  }
}

resource "aws_iam_role_policy" "gpu_node" {
  name   = "weights-read-logs-write"
  role   = aws_iam_role.gpu_node.id
  policy = data.aws_iam_policy_document.gpu_node.json
}

resource "aws_iam_role_policy_attachment" "gpu_node_ssm" {
  count = var.enable_ssm_session_manager ? 1 : 0

  role       = aws_iam_role.gpu_node.name
  policy_arn = local.ssm_core_policy_arn
}

resource "aws_iam_instance_profile" "gpu_node" {
  name_prefix = "${local.name}-gpu-"
  role        = aws_iam_role.gpu_node.name
}

# ---------------------------------------------------------------------------
# Control plane
# ---------------------------------------------------------------------------

resource "aws_iam_role" "control_plane" {
  name_prefix        = "${local.name}-cp-"
  description        = "thawpool control plane: weights bucket read/write, database secret read, logs write, outbox volume attach"
  assume_role_policy = data.aws_iam_policy_document.ec2_assume.json
}

data "aws_iam_policy_document" "control_plane" {
  statement {
    sid       = "ListWeights"
    actions   = ["s3:ListBucket", "s3:ListBucketVersions", "s3:GetBucketLocation", "s3:ListBucketMultipartUploads"]
    resources = [aws_s3_bucket.weights.arn]
  }

  statement {
    sid = "ReadWriteWeights"
    actions = [
      "s3:GetObject",
      "s3:GetObjectVersion",
      "s3:PutObject",
      "s3:DeleteObject",
      "s3:AbortMultipartUpload",
      "s3:ListMultipartUploadParts",
    ]
    resources = [local.weights_objects_arn]
  }

  statement {
    sid       = "UseDataKeyThroughS3"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [aws_kms_key.data.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = [local.s3_via_service]
    }
  }

  statement {
    sid       = "ReadDatabaseSecret"
    actions   = ["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"]
    resources = [local.db_secret_arn]
  }

  statement {
    sid       = "DecryptDatabaseSecret"
    actions   = ["kms:Decrypt"]
    resources = [aws_kms_key.data.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["secretsmanager.${local.region}.amazonaws.com"]
    }
  }

  statement {
    sid = "WriteOwnLogs"
    actions = [
      "logs:CreateLogStream",
      "logs:PutLogEvents",
      "logs:DescribeLogStreams",
    ]
    resources = [
      aws_cloudwatch_log_group.control_plane.arn,
      "${aws_cloudwatch_log_group.control_plane.arn}:log-stream:*",
    ]
  }

  # The usage outbox volume, attached by the boot script to the node itself.
  statement {
    sid     = "AttachOutboxVolume"
    actions = ["ec2:AttachVolume"]
    resources = [
      aws_ebs_volume.outbox.arn,
      "arn:${local.partition}:ec2:${local.region}:${local.account_id}:instance/*",
    ]

    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/Role"
      values   = ["control-plane"]
    }
  }

  # EBS opens the volume's data key on the node's behalf (a grant for the instance).
  statement {
    sid       = "UseDataKeyThroughEbs"
    actions   = ["kms:Decrypt", "kms:DescribeKey", "kms:GenerateDataKeyWithoutPlaintext", "kms:ReEncrypt*"]
    resources = [aws_kms_key.data.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["ec2.${local.region}.amazonaws.com"]
    }
  }

  statement {
    sid       = "GrantDataKeyToEbs"
    actions   = ["kms:CreateGrant"]
    resources = [aws_kms_key.data.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["ec2.${local.region}.amazonaws.com"]
    }

    condition {
      test     = "Bool"
      variable = "kms:GrantIsForAWSResource"
      values   = ["true"]
    }
  }

  # The Ray head runs on this node; GPU nodes find it by this one DNS name.
  statement {
    sid       = "PublishRayHeadAddress"
    actions   = ["route53:ChangeResourceRecordSets"]
    resources = [aws_route53_zone.internal.arn]

    condition {
      test     = "ForAllValues:StringEquals"
      variable = "route53:ChangeResourceRecordSetsNormalizedRecordNames"
      values   = [local.ray_head_fqdn]
    }

    condition {
      test     = "ForAllValues:StringEquals"
      variable = "route53:ChangeResourceRecordSetsRecordTypes"
      values   = ["A"]
    }
  }
}

resource "aws_iam_role_policy" "control_plane" {
  name   = "weights-rw-db-secret-logs"
  role   = aws_iam_role.control_plane.id
  policy = data.aws_iam_policy_document.control_plane.json
}

resource "aws_iam_role_policy_attachment" "control_plane_ssm" {
  count = var.enable_ssm_session_manager ? 1 : 0

  role       = aws_iam_role.control_plane.name
  policy_arn = local.ssm_core_policy_arn
}

resource "aws_iam_instance_profile" "control_plane" {
  name_prefix = "${local.name}-cp-"
  role        = aws_iam_role.control_plane.name
}

# ---------------------------------------------------------------------------
# VPC flow logs
# ---------------------------------------------------------------------------

data "aws_iam_policy_document" "flow_logs_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["vpc-flow-logs.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }
}

resource "aws_iam_role" "flow_logs" {
  name_prefix        = "${local.name}-flow-logs-"
  description        = "VPC flow logs delivery into one log group"
  assume_role_policy = data.aws_iam_policy_document.flow_logs_assume.json
}

data "aws_iam_policy_document" "flow_logs" {
  statement {
    actions = [
      "logs:CreateLogStream",
      "logs:PutLogEvents",
      "logs:DescribeLogStreams",
    ]
    resources = [
      aws_cloudwatch_log_group.flow_logs.arn,
      "${aws_cloudwatch_log_group.flow_logs.arn}:log-stream:*",
    ]
  }
}

resource "aws_iam_role_policy" "flow_logs" {
  name   = "write-flow-logs"
  role   = aws_iam_role.flow_logs.id
  policy = data.aws_iam_policy_document.flow_logs.json
}

# ---------------------------------------------------------------------------
# RDS enhanced monitoring
# ---------------------------------------------------------------------------

data "aws_iam_policy_document" "rds_monitoring_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["monitoring.rds.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "rds_monitoring" {
  name_prefix        = "${local.name}-rds-mon-"
  description        = "RDS enhanced monitoring"
  assume_role_policy = data.aws_iam_policy_document.rds_monitoring_assume.json
}

resource "aws_iam_role_policy_attachment" "rds_monitoring" {
  role       = aws_iam_role.rds_monitoring.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AmazonRDSEnhancedMonitoringRole"
}
