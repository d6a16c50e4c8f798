# The control-plane node: one EC2 instance, kept at exactly one by an
# autoscaling group that replaces it when the ALB health check fails. It runs
# the Ray head and the thawpool control plane (`--backend ray`), which keeps all
# of its state in Postgres and re-adopts live replicas after a restart. Clients
# reach it only through the ALB (TLS terminated with the ACM certificate).
#
# The one thing it keeps on disk is the usage outbox (docs/billing-guarantees.md):
# usage events Postgres has not taken yet, fsynced, replayed when it answers. It
# lives on an EBS volume of its own that outlives any instance; each new node
# attaches and mounts it at boot. EBS lives in one zone, so the node is launched
# in that zone's private subnet.

locals {
  internal_zone_name = "${local.name}.internal"
  ray_head_fqdn      = "ray-head.${local.internal_zone_name}"

  # `thawpool up` with nothing embedded: THAWPOOL_DATABASE_URL (built from the
  # RDS secret at every start) makes Postgres external, `--s3-endpoint aws` is
  # AWS S3 itself. The Ray head runs on the same node, so the driver finds it
  # with "auto".
  control_plane_args = var.control_plane_args != null ? var.control_plane_args : [
    "up",
    "--host", "0.0.0.0",
    "--port", tostring(var.control_plane_port),
    "--s3-endpoint", "aws",
    "--backend", "ray",
    "--ray-address", "auto",
  ]

  control_plane_cloudwatch_config = jsonencode({
    agent = { region = local.region, run_as_user = "root" }
    logs = {
      logs_collected = {
        files = {
          collect_list = [
            {
              file_path       = "/var/log/thawpool/*.log"
              log_group_name  = aws_cloudwatch_log_group.control_plane.name
              log_stream_name = "{instance_id}/thawpool"
            },
            {
              file_path       = "/var/log/thawpool-bootstrap.log"
              log_group_name  = aws_cloudwatch_log_group.control_plane.name
              log_stream_name = "{instance_id}/bootstrap"
            },
            {
              file_path       = "/tmp/ray/session_latest/logs/gcs_server.*"
              log_group_name  = aws_cloudwatch_log_group.control_plane.name
              log_stream_name = "{instance_id}/ray-gcs"
            },
          ]
        }
      }
    }
  })
}

data "aws_ssm_parameter" "control_plane_ami" {
  count = var.control_plane_ami_id == null ? 1 : 0

  name = var.control_plane_ami_ssm_parameter
}

# ---------------------------------------------------------------------------
# Private DNS: the Ray head's stable name
# ---------------------------------------------------------------------------

resource "aws_route53_zone" "internal" {
  #checkov:skip=CKV2_AWS_38:DNSSEC signing applies to public hosted zones; this zone is private to the VPC.
  #checkov:skip=CKV2_AWS_39:Query logging applies to public hosted zones; lookups in this private zone are covered by the VPC flow logs.
  name    = local.internal_zone_name
  comment = "thawpool private names (Ray head)"

  vpc {
    vpc_id = aws_vpc.main.id
  }
}

# ---------------------------------------------------------------------------
# Application load balancer
# ---------------------------------------------------------------------------

resource "aws_lb" "main" {
  name               = local.name
  load_balancer_type = "application"
  internal           = false
  security_groups    = [aws_security_group.alb.id]
  subnets            = aws_subnet.public[*].id

  drop_invalid_header_fields = true
  enable_deletion_protection = var.alb_deletion_protection
  idle_timeout               = var.alb_idle_timeout_s

  access_logs {
    bucket  = aws_s3_bucket.logs.id
    prefix  = "alb"
    enabled = true
  }

  depends_on = [aws_s3_bucket_policy.logs]
}

resource "aws_lb_target_group" "control_plane" {
  #checkov:skip=CKV_AWS_378:TLS ends at the ALB; the hop to the target stays inside the VPC, from the ALB's security group to the control plane's only.
  name                 = "${local.name}-cp"
  port                 = var.control_plane_port
  protocol             = "HTTP"
  target_type          = "instance"
  vpc_id               = aws_vpc.main.id
  deregistration_delay = 120

  health_check {
    enabled             = true
    path                = var.control_plane_health_check_path
    matcher             = "200"
    interval            = 15
    timeout             = 5
    healthy_threshold   = 2
    unhealthy_threshold = 4
  }
}

resource "aws_lb_listener" "https" {
  load_balancer_arn = aws_lb.main.arn
  port              = 443
  protocol          = "HTTPS"
  ssl_policy        = var.alb_ssl_policy
  certificate_arn   = var.certificate_arn

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.control_plane.arn
  }
}

resource "aws_lb_listener" "http_redirect" {
  load_balancer_arn = aws_lb.main.arn
  port              = 80
  protocol          = "HTTP"

  default_action {
    type = "redirect"

    redirect {
      port        = "443"
      protocol    = "HTTPS"
      status_code = "HTTP_301"
    }
  }
}

# ---------------------------------------------------------------------------
# WAF in front of the ALB
# ---------------------------------------------------------------------------

resource "aws_wafv2_web_acl" "main" {
  count = var.enable_waf ? 1 : 0

  name        = local.name
  description = "thawpool ALB: AWS managed rules and a per-IP rate limit"
  scope       = "REGIONAL"

  default_action {
    allow {}
  }

  rule {
    name     = "rate-limit-per-ip"
    priority = 0

    action {
      block {}
    }

    statement {
      rate_based_statement {
        limit              = var.waf_rate_limit_per_5min
        aggregate_key_type = "IP"
      }
    }

    visibility_config {
      cloudwatch_metrics_enabled = true
      metric_name                = "${local.name}-rate-limit"
      sampled_requests_enabled   = true
    }
  }

  rule {
    name     = "aws-common"
    priority = 1

    override_action {
      none {}
    }

    statement {
      managed_rule_group_statement {
        vendor_name = "AWS"
        name        = "AWSManagedRulesCommonRuleSet"

        # Prompts are large request bodies that often contain code, HTML and
        # URLs; the body-inspecting rules would block ordinary completions.
        # They count (visible in the WAF logs) instead of blocking.
        dynamic "rule_action_override" {
          for_each = ["SizeRestrictions_BODY", "CrossSiteScripting_BODY", "GenericLFI_BODY", "GenericRFI_BODY", "EC2MetaDataSSRF_BODY"]

          content {
            name = rule_action_override.value

            action_to_use {
              count {}
            }
          }
        }
      }
    }

    visibility_config {
      cloudwatch_metrics_enabled = true
      metric_name                = "${local.name}-aws-common"
      sampled_requests_enabled   = true
    }
  }

  # Anonymizers (Tor, VPNs) are blocked; calls from cloud hosting providers,
  # where many API clients run, are only counted.
  rule {
    name     = "aws-anonymous-ip"
    priority = 2

    override_action {
      none {}
    }

    statement {
      managed_rule_group_statement {
        vendor_name = "AWS"
        name        = "AWSManagedRulesAnonymousIpList"

        rule_action_override {
          name = "HostingProviderIPList"

          action_to_use {
            count {}
          }
        }
      }
    }

    visibility_config {
      cloudwatch_metrics_enabled = true
      metric_name                = "${local.name}-anonymous-ip"
      sampled_requests_enabled   = true
    }
  }

  rule {
    name     = "aws-known-bad-inputs"
    priority = 3

    override_action {
      none {}
    }

    statement {
      managed_rule_group_statement {
        vendor_name = "AWS"
        name        = "AWSManagedRulesKnownBadInputsRuleSet"
      }
    }

    visibility_config {
      cloudwatch_metrics_enabled = true
      metric_name                = "${local.name}-known-bad-inputs"
      sampled_requests_enabled   = true
    }
  }

  visibility_config {
    cloudwatch_metrics_enabled = true
    metric_name                = local.name
    sampled_requests_enabled   = true
  }
}

resource "aws_wafv2_web_acl_association" "alb" {
  count = var.enable_waf ? 1 : 0

  resource_arn = aws_lb.main.arn
  web_acl_arn  = aws_wafv2_web_acl.main[0].arn
}

resource "aws_wafv2_web_acl_logging_configuration" "main" {
  count = var.enable_waf ? 1 : 0

  resource_arn            = aws_wafv2_web_acl.main[0].arn
  log_destination_configs = [aws_cloudwatch_log_group.waf[0].arn]

  # API keys travel in this header; keep them out of the logs.
  redacted_fields {
    single_header {
      name = "authorization"
    }
  }

  depends_on = [aws_cloudwatch_log_resource_policy.waf]
}

# ---------------------------------------------------------------------------
# Control-plane node
# ---------------------------------------------------------------------------

resource "aws_launch_template" "control_plane" {
  name_prefix            = "${local.name}-cp-"
  description            = "thawpool control plane and Ray head"
  image_id               = var.control_plane_ami_id != null ? var.control_plane_ami_id : data.aws_ssm_parameter.control_plane_ami[0].insecure_value
  instance_type          = var.control_plane_instance_type
  update_default_version = true
  ebs_optimized          = true

  iam_instance_profile {
    arn = aws_iam_instance_profile.control_plane.arn
  }

  network_interfaces {
    associate_public_ip_address = false
    delete_on_termination       = true
    security_groups             = [aws_security_group.control_plane.id, aws_security_group.ray_cluster.id]
  }

  block_device_mappings {
    device_name = "/dev/xvda"

    ebs {
      volume_size           = 40
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  monitoring {
    enabled = true
  }

  user_data = base64encode(templatefile("${path.module}/templates/control_plane_user_data.sh.tftpl", {
    region                  = local.region
    outbox_volume_id        = aws_ebs_volume.outbox.id
    install_spec            = var.thawpool_install_spec
    ray_version             = var.ray_version
    weights_bucket          = aws_s3_bucket.weights.id
    db_host                 = aws_db_instance.main.address
    db_port                 = aws_db_instance.main.port
    db_name                 = var.db_name
    db_secret_arn           = local.db_secret_arn
    zone_id                 = aws_route53_zone.internal.zone_id
    ray_head_fqdn           = local.ray_head_fqdn
    gpu_memory_gb           = var.gpu_memory_gb
    control_plane_args      = join(" ", [for a in local.control_plane_args : "'${replace(a, "'", "'\\''")}'"])
    cloudwatch_agent_config = local.control_plane_cloudwatch_config
  }))

  tag_specifications {
    resource_type = "instance"
    tags          = { Name = "${local.name}-control-plane", Role = "control-plane" }
  }

  tag_specifications {
    resource_type = "volume"
    tags          = { Name = "${local.name}-control-plane", Role = "control-plane" }
  }
}

resource "aws_autoscaling_group" "control_plane" {
  name_prefix      = "${local.name}-cp-"
  min_size         = 1
  max_size         = 1
  desired_capacity = 1
  # The zone of the outbox volume: a node elsewhere could not attach it.
  vpc_zone_identifier = [aws_subnet.private[0].id]
  target_group_arns   = [aws_lb_target_group.control_plane.arn]

  # Replace the node when the control plane stops answering, after it had time
  # to install and start.
  health_check_type         = "ELB"
  health_check_grace_period = 900

  launch_template {
    id      = aws_launch_template.control_plane.id
    version = aws_launch_template.control_plane.latest_version
  }

  # One node at a time: the Ray head is a single process. A new launch template
  # version replaces the node (a short outage; GPU nodes rejoin the new head).
  instance_refresh {
    strategy = "Rolling"

    preferences {
      min_healthy_percentage = 0
    }
  }

  tag {
    key                 = "Name"
    value               = "${local.name}-control-plane"
    propagate_at_launch = true
  }

  depends_on = [
    aws_iam_role_policy.control_plane,
    aws_route_table_association.private,
    aws_route.private_nat,
  ]
}

# ---------------------------------------------------------------------------
# The usage outbox: survives instance replacement
# ---------------------------------------------------------------------------

resource "aws_ebs_volume" "outbox" {
  availability_zone = local.azs[0]
  size              = var.outbox_volume_gb
  type              = "gp3"
  encrypted         = true
  kms_key_id        = aws_kms_key.data.arn

  tags = { Name = "${local.name}-usage-outbox", Role = "control-plane" }
}
