terraform {
  required_version = ">= 1.5.0"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # 5.100.0 is the version tested offline (see docs/terraform.md).
      version = ">= 5.60, < 6.0"
    }
  }

  # Remote state: the settings come from `terraform init -backend-config=backend.hcl`
  # so that every environment picks its own state bucket (see docs/terraform.md).
  backend "s3" {}
}

provider "aws" {
  region = var.region

  default_tags {
    tags = merge(
      {
        Project     = "thawpool"
        Environment = var.environment
        ManagedBy   = "terraform"
      },
      var.tags,
    )
  }
}

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

locals {
  name       = "${var.name}-${var.environment}"
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
  region     = data.aws_region.current.name
}
