output "alb_dns_name" {
  description = "DNS name of the ALB; point a CNAME (or Route 53 alias) for the certificate's host name at it."
  value       = aws_lb.main.dns_name
}

output "alb_zone_id" {
  description = "Hosted zone id of the ALB, for a Route 53 alias record."
  value       = aws_lb.main.zone_id
}

output "weights_bucket" {
  description = "S3 bucket for model weights: deploy with model_uri = s3://<bucket>/<prefix>/."
  value       = aws_s3_bucket.weights.id
}

output "logs_bucket" {
  description = "S3 bucket holding S3 and ALB access logs."
  value       = aws_s3_bucket.logs.id
}

output "db_endpoint" {
  description = "RDS PostgreSQL endpoint (host:port), reachable only from the control plane."
  value       = aws_db_instance.main.endpoint
}

output "db_secret_arn" {
  description = "Secrets Manager secret (managed by RDS) with the database user name and password."
  value       = local.db_secret_arn
}

output "ray_head_address" {
  description = "Address GPU nodes (and `--ray-address`) use to reach the Ray head inside the VPC."
  value       = "${local.ray_head_fqdn}:6379"
}

output "control_plane_asg_name" {
  description = "Autoscaling group of the control-plane node."
  value       = aws_autoscaling_group.control_plane.name
}

output "outbox_volume_id" {
  description = "EBS volume holding the control plane's usage outbox (mounted at /var/lib/thawpool/outbox)."
  value       = aws_ebs_volume.outbox.id
}

output "gpu_asg_name" {
  description = "Autoscaling group of the GPU nodes (scale with `aws autoscaling set-desired-capacity`)."
  value       = aws_autoscaling_group.gpu_nodes.name
}

output "vpc_id" {
  description = "VPC id."
  value       = aws_vpc.main.id
}

output "private_subnet_ids" {
  description = "Private subnet ids (control plane, GPU nodes, database)."
  value       = aws_subnet.private[*].id
}

output "log_groups" {
  description = "CloudWatch log groups by component."
  value = {
    control_plane = aws_cloudwatch_log_group.control_plane.name
    gpu_nodes     = aws_cloudwatch_log_group.gpu_nodes.name
    vpc_flow_logs = aws_cloudwatch_log_group.flow_logs.name
  }
}

output "kms_key_arns" {
  description = "Customer-managed KMS keys (data: bucket, database, secret; logs: log groups)."
  value = {
    data = aws_kms_key.data.arn
    logs = aws_kms_key.logs.arn
  }
}
