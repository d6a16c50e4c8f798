# ---------------------------------------------------------------------------
# General
# ---------------------------------------------------------------------------

variable "region" {
  description = "AWS region to deploy into."
  type        = string
  default     = "us-east-1"
}

variable "name" {
  description = "Name prefix for every resource."
  type        = string
  default     = "thawpool"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,15}$", var.name))
    error_message = "name must be 2-16 characters of lowercase letters, digits and '-', starting with a letter."
  }
}

variable "environment" {
  description = "Environment name (prod, staging, ...); part of every resource name."
  type        = string
  default     = "prod"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,9}$", var.environment))
    error_message = "environment must be 2-10 characters of lowercase letters, digits and '-'."
  }
}

variable "tags" {
  description = "Extra tags applied to every resource."
  type        = map(string)
  default     = {}
}

# ---------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------

variable "vpc_cidr" {
  description = "CIDR block of the VPC."
  type        = string
  default     = "10.40.0.0/16"

  validation {
    condition     = can(cidrhost(var.vpc_cidr, 0))
    error_message = "vpc_cidr must be a valid IPv4 CIDR block."
  }
}

variable "availability_zones" {
  description = "Availability zones to spread subnets over (2 or 3 names). Empty: the region's \"a\" and \"b\" zones."
  type        = list(string)
  default     = []

  validation {
    condition     = length(var.availability_zones) == 0 || (length(var.availability_zones) >= 2 && length(var.availability_zones) <= 3)
    error_message = "availability_zones must name 2 or 3 zones (the ALB and RDS need at least two)."
  }
}

variable "single_nat_gateway" {
  description = "One NAT gateway for all AZs (cheaper, one AZ is a single point of failure for egress) instead of one per AZ."
  type        = bool
  default     = false
}

# ---------------------------------------------------------------------------
# Load balancer and TLS
# ---------------------------------------------------------------------------

variable "certificate_arn" {
  description = "ARN of an ACM certificate (in var.region) for the HTTPS listener of the ALB."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:acm:[a-z0-9-]+:[0-9]{12}:certificate/.+$", var.certificate_arn))
    error_message = "certificate_arn must be an ACM certificate ARN."
  }
}

variable "alb_ingress_cidrs" {
  description = "CIDR blocks allowed to reach the ALB on 80 (redirect only) and 443."
  type        = list(string)
  default     = ["0.0.0.0/0"]
}

variable "alb_ssl_policy" {
  description = "TLS policy of the HTTPS listener (TLS 1.2+ only)."
  type        = string
  default     = "ELBSecurityPolicy-TLS13-1-2-2021-06"
}

variable "alb_deletion_protection" {
  description = "Deletion protection on the ALB."
  type        = bool
  default     = true
}

variable "alb_idle_timeout_s" {
  description = "ALB idle timeout in seconds. Token streams and cold starts can be silent for a while, so this is longer than the 60 s default."
  type        = number
  default     = 600
}

variable "enable_waf" {
  description = "Attach an AWS WAFv2 web ACL with the AWS managed common and known-bad-inputs rule sets to the ALB."
  type        = bool
  default     = true
}

variable "waf_rate_limit_per_5min" {
  description = "Requests per 5 minutes per client IP before WAF blocks it."
  type        = number
  default     = 20000
}

# ---------------------------------------------------------------------------
# Storage
# ---------------------------------------------------------------------------

variable "weights_bucket_name" {
  description = "Name of the S3 bucket for model weights. Empty: <name>-<environment>-weights-<account id>."
  type        = string
  default     = ""
}

variable "force_destroy_buckets" {
  description = "Allow `terraform destroy` to delete non-empty buckets. Keep false outside of test accounts."
  type        = bool
  default     = false
}

variable "noncurrent_version_expiration_days" {
  description = "Days after which non-current versions of weight objects are deleted."
  type        = number
  default     = 90
}

variable "access_log_retention_days" {
  description = "Days to keep S3 server access logs and ALB access logs."
  type        = number
  default     = 365
}

# ---------------------------------------------------------------------------
# Database
# ---------------------------------------------------------------------------

variable "db_engine_version" {
  description = "RDS PostgreSQL major or major.minor version."
  type        = string
  default     = "16"
}

variable "db_instance_class" {
  description = "RDS instance class."
  type        = string
  default     = "db.t4g.medium"
}

variable "db_allocated_storage_gb" {
  description = "Initial storage of the database, in GiB."
  type        = number
  default     = 50
}

variable "db_max_allocated_storage_gb" {
  description = "Storage autoscaling ceiling, in GiB."
  type        = number
  default     = 500
}

variable "db_multi_az" {
  description = "Multi-AZ standby for the database."
  type        = bool
  default     = true
}

variable "db_backup_retention_days" {
  description = "Automated backup retention, in days (1-35)."
  type        = number
  default     = 14

  validation {
    condition     = var.db_backup_retention_days >= 1 && var.db_backup_retention_days <= 35
    error_message = "db_backup_retention_days must be between 1 and 35."
  }
}

variable "db_deletion_protection" {
  description = "Deletion protection on the database. Set false (and apply) before `terraform destroy`."
  type        = bool
  default     = true
}

variable "db_skip_final_snapshot" {
  description = "Skip the final snapshot on destroy. Keep false outside of test accounts."
  type        = bool
  default     = false
}

variable "db_name" {
  description = "Name of the database thawpool uses."
  type        = string
  default     = "thawpool"
}

variable "db_username" {
  description = "Master user name; the password is generated and kept by RDS in Secrets Manager."
  type        = string
  default     = "thawpool"
}

# ---------------------------------------------------------------------------
# Control plane (thawpool API + Ray head)
# ---------------------------------------------------------------------------

variable "control_plane_instance_type" {
  description = "EC2 instance type of the control-plane node (runs the thawpool API and the Ray head; no GPU)."
  type        = string
  default     = "m7i.large"
}

variable "control_plane_ami_ssm_parameter" {
  description = "SSM parameter holding the AMI of the control-plane node (Amazon Linux 2023 by default)."
  type        = string
  default     = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
}

variable "control_plane_ami_id" {
  description = "Pinned AMI of the control-plane node. null: the latest from control_plane_ami_ssm_parameter, which replaces the node (instance refresh) whenever AWS publishes a new image; pin it in production."
  type        = string
  default     = null
}

variable "control_plane_port" {
  description = "Port the thawpool control plane listens on, behind the ALB."
  type        = number
  default     = 8080
}

variable "outbox_volume_gb" {
  description = "Size of the EBS volume that holds the control plane's usage outbox (events waiting for Postgres; ~1 KB each). It outlives the control-plane instance."
  type        = number
  default     = 20

  validation {
    condition     = var.outbox_volume_gb >= 1
    error_message = "outbox_volume_gb must be at least 1."
  }
}

variable "control_plane_health_check_path" {
  description = "HTTP path the ALB probes on the control plane."
  type        = string
  default     = "/healthz"
}

variable "thawpool_install_spec" {
  description = "What `pip install` installs on every node: a PyPI requirement (\"thawpool[ray]==0.1.0\") or an s3:// URI of a wheel in the weights bucket (under artifacts/)."
  type        = string
  default     = "thawpool[ray]==0.1.0"
}

variable "control_plane_args" {
  description = "Arguments of the `thawpool` command on the control-plane node. null: up --host 0.0.0.0 --port <control_plane_port> --s3-endpoint aws --backend ray --ray-address auto (nothing embedded). The database URL and region come from the environment (THAWPOOL_DATABASE_URL, AWS_DEFAULT_REGION)."
  type        = list(string)
  default     = null
}

variable "ray_version" {
  description = "Ray version installed on every node; head and workers must match."
  type        = string
  default     = "2.60.0"
}

variable "enable_ssm_session_manager" {
  description = "Attach AmazonSSMManagedInstanceCore to the node roles so operators can open shells with Session Manager (no SSH keys, no port 22). Off by default: it widens the node roles."
  type        = bool
  default     = false
}

# ---------------------------------------------------------------------------
# GPU node group
# ---------------------------------------------------------------------------

variable "gpu_instance_type" {
  description = "EC2 instance type of the GPU nodes (g5.xlarge: 1x A10G 24 GB; g6e.xlarge: 1x L40S 48 GB; p4d.24xlarge: 8x A100)."
  type        = string
  default     = "g5.xlarge"
}

variable "gpu_memory_gb" {
  description = "Memory of one GPU of gpu_instance_type in GB (Ray counts GPUs, not their memory); the pool places replicas against it. 24 for g5.xlarge (A10G), 48 for g6e (L40S), 40 for p4d (A100 40 GB)."
  type        = number
  default     = 24

  validation {
    condition     = var.gpu_memory_gb > 0
    error_message = "gpu_memory_gb must be positive."
  }
}

variable "gpu_min_size" {
  description = "Minimum number of GPU nodes. 0 lets the whole GPU fleet scale to nothing."
  type        = number
  default     = 0
}

variable "gpu_max_size" {
  description = "Maximum number of GPU nodes."
  type        = number
  default     = 4
}

variable "gpu_desired_capacity" {
  description = "Initial number of GPU nodes. Terraform ignores later changes so that an autoscaler may own it."
  type        = number
  default     = 1
}

variable "gpu_ami_ssm_parameter" {
  description = "SSM parameter holding the AMI of the GPU nodes (an AWS Deep Learning Base AMI with NVIDIA drivers by default)."
  type        = string
  default     = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
}

variable "gpu_ami_id" {
  description = "Pinned AMI of the GPU nodes (for example one baked with /opt/thawpool/venv). null: the latest from gpu_ami_ssm_parameter."
  type        = string
  default     = null
}

variable "gpu_root_volume_gb" {
  description = "Root EBS volume of a GPU node, in GiB (holds the Python env and the weight cache unless the instance has local NVMe)."
  type        = number
  default     = 200
}

variable "gpu_capacity_rebalance" {
  description = "Enable capacity rebalancing on the GPU autoscaling group."
  type        = bool
  default     = false
}

# ---------------------------------------------------------------------------
# Logs
# ---------------------------------------------------------------------------

variable "log_retention_days" {
  description = "Retention of the CloudWatch log groups, in days."
  type        = number
  default     = 365

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be a value CloudWatch Logs accepts (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, ...)."
  }
}
