# GPU node group: a launch template and an autoscaling group. Each node joins
# the Ray head by its private DNS name; the thawpool pool then places replicas
# on the node's GPUs as Ray actors. min/max/instance type are variables.
# The pool scales replicas (down to zero); the number of nodes is the group's
# desired capacity, which terraform sets once and then leaves alone.

locals {
  gpu_node_cloudwatch_config = jsonencode({
    agent = { region = local.region, run_as_user = "root" }
    logs = {
      logs_collected = {
        files = {
          collect_list = [
            {
              file_path       = "/var/log/thawpool/*.log"
              log_group_name  = aws_cloudwatch_log_group.gpu_nodes.name
              log_stream_name = "{instance_id}/thawpool"
            },
            {
              file_path       = "/var/log/thawpool-bootstrap.log"
              log_group_name  = aws_cloudwatch_log_group.gpu_nodes.name
              log_stream_name = "{instance_id}/bootstrap"
            },
            {
              # Runtime replicas run inside Ray workers; their output lands here.
              file_path       = "/tmp/ray/session_latest/logs/worker-*"
              log_group_name  = aws_cloudwatch_log_group.gpu_nodes.name
              log_stream_name = "{instance_id}/ray-workers"
            },
            {
              file_path       = "/tmp/ray/session_latest/logs/raylet.*"
              log_group_name  = aws_cloudwatch_log_group.gpu_nodes.name
              log_stream_name = "{instance_id}/raylet"
            },
          ]
        }
      }
    }
  })
}

data "aws_ssm_parameter" "gpu_ami" {
  count = var.gpu_ami_id == null ? 1 : 0

  name = var.gpu_ami_ssm_parameter
}

resource "aws_launch_template" "gpu_node" {
  name_prefix            = "${local.name}-gpu-"
  description            = "thawpool GPU node (Ray worker)"
  image_id               = var.gpu_ami_id != null ? var.gpu_ami_id : data.aws_ssm_parameter.gpu_ami[0].insecure_value
  instance_type          = var.gpu_instance_type
  update_default_version = true
  ebs_optimized          = true

  iam_instance_profile {
    arn = aws_iam_instance_profile.gpu_node.arn
  }

  network_interfaces {
    associate_public_ip_address = false
    delete_on_termination       = true
    security_groups             = [aws_security_group.ray_cluster.id]
  }

  block_device_mappings {
    device_name = "/dev/sda1"

    ebs {
      volume_size           = var.gpu_root_volume_gb
      volume_type           = "gp3"
      throughput            = 500
      iops                  = 6000
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

  user_data = base64encode(templatefile("${path.module}/templates/gpu_node_user_data.sh.tftpl", {
    region                  = local.region
    install_spec            = var.thawpool_install_spec
    ray_version             = var.ray_version
    weights_bucket          = aws_s3_bucket.weights.id
    ray_head_fqdn           = local.ray_head_fqdn
    cloudwatch_agent_config = local.gpu_node_cloudwatch_config
  }))

  tag_specifications {
    resource_type = "instance"
    tags          = { Name = "${local.name}-gpu-node", Role = "gpu-node" }
  }

  tag_specifications {
    resource_type = "volume"
    tags          = { Name = "${local.name}-gpu-node", Role = "gpu-node" }
  }
}

resource "aws_autoscaling_group" "gpu_nodes" {
  name_prefix         = "${local.name}-gpu-"
  min_size            = var.gpu_min_size
  max_size            = var.gpu_max_size
  desired_capacity    = var.gpu_desired_capacity
  vpc_zone_identifier = aws_subnet.private[*].id
  capacity_rebalance  = var.gpu_capacity_rebalance

  health_check_type         = "EC2"
  health_check_grace_period = 600
  default_instance_warmup   = 600

  launch_template {
    id      = aws_launch_template.gpu_node.id
    version = aws_launch_template.gpu_node.latest_version
  }

  tag {
    key                 = "Name"
    value               = "${local.name}-gpu-node"
    propagate_at_launch = true
  }

  lifecycle {
    precondition {
      condition     = var.gpu_min_size <= var.gpu_desired_capacity && var.gpu_desired_capacity <= var.gpu_max_size
      error_message = "Need gpu_min_size <= gpu_desired_capacity <= gpu_max_size."
    }

    # Whoever scales the node group (an operator, a scheduled action, a future
    # autoscaler) owns the desired capacity after the first apply.
    ignore_changes = [desired_capacity]
  }

  depends_on = [
    aws_iam_role_policy.gpu_node,
    aws_route_table_association.private,
    aws_route.private_nat,
  ]
}
