# Two buckets:
#  - weights: model folders (s3://<bucket>/<prefix>/ with config.json,
#    *.safetensors, tokenizer files) and, under artifacts/, optional thawpool
#    wheels for the nodes. Versioned, KMS-encrypted, private, TLS only.
#  - logs: S3 server access logs of the weights bucket and ALB access logs.
#    Neither log delivery service can write to a KMS-encrypted bucket, so this
#    one uses SSE-S3 (see docs/terraform.md, checkov skips).

locals {
  weights_bucket_name = var.weights_bucket_name != "" ? var.weights_bucket_name : "${local.name}-weights-${local.account_id}"
  logs_bucket_name    = "${local.name}-logs-${local.account_id}"
}

# ---------------------------------------------------------------------------
# Weights bucket
# ---------------------------------------------------------------------------

resource "aws_s3_bucket" "weights" {
  #checkov:skip=CKV_AWS_144:Weights are uploaded by users from their own copies; versioning protects against deletion. Cross-region replication would double the largest storage bill; add it per environment if a second region must serve cold starts.
  bucket        = local.weights_bucket_name
  force_destroy = var.force_destroy_buckets

  tags = { Name = local.weights_bucket_name }
}

resource "aws_s3_bucket_ownership_controls" "weights" {
  bucket = aws_s3_bucket.weights.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "weights" {
  bucket = aws_s3_bucket.weights.id

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_versioning" "weights" {
  bucket = aws_s3_bucket.weights.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "weights" {
  bucket = aws_s3_bucket.weights.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.data.arn
    }
    # One data key per bucket instead of one KMS call per object: multi-GB
    # safetensors reads stay cheap.
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_logging" "weights" {
  bucket = aws_s3_bucket.weights.id

  target_bucket = aws_s3_bucket.logs.id
  target_prefix = "s3/${local.weights_bucket_name}/"
}

resource "aws_s3_bucket_lifecycle_configuration" "weights" {
  bucket = aws_s3_bucket.weights.id

  rule {
    id     = "abort-incomplete-uploads"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
  }

  rule {
    id     = "expire-noncurrent-versions"
    status = "Enabled"

    filter {}

    noncurrent_version_expiration {
      noncurrent_days = var.noncurrent_version_expiration_days
    }
  }

  depends_on = [aws_s3_bucket_versioning.weights]
}

# Object-level events go to EventBridge (free for S3 events) so that a platform
# team can audit or react to new model uploads without touching this stack.
resource "aws_s3_bucket_notification" "weights" {
  bucket      = aws_s3_bucket.weights.id
  eventbridge = true
}

data "aws_iam_policy_document" "weights_bucket" {
  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.weights.arn,
      "${aws_s3_bucket.weights.arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }

  statement {
    sid       = "DenyOutdatedTLS"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.weights.arn, "${aws_s3_bucket.weights.arn}/*"]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "NumericLessThan"
      variable = "s3:TlsVersion"
      values   = ["1.2"]
    }
  }
}

resource "aws_s3_bucket_policy" "weights" {
  bucket = aws_s3_bucket.weights.id
  policy = data.aws_iam_policy_document.weights_bucket.json

  depends_on = [aws_s3_bucket_public_access_block.weights]
}

# ---------------------------------------------------------------------------
# Logs bucket (S3 server access logs, ALB access logs)
# ---------------------------------------------------------------------------

resource "aws_s3_bucket" "logs" {
  #checkov:skip=CKV_AWS_18:This is the access-log target bucket; logging it into itself would loop.
  #checkov:skip=CKV_AWS_144:Access logs are kept for audit in one region; replicating them is a per-organisation choice (often a central log archive account).
  #checkov:skip=CKV_AWS_145:S3 server access logging and ALB access logs can only be delivered to buckets encrypted with SSE-S3 (AES256), not SSE-KMS.
  #checkov:skip=CKV2_AWS_62:Nothing consumes per-object events of log files; notifications would only add noise.
  bucket        = local.logs_bucket_name
  force_destroy = var.force_destroy_buckets

  tags = { Name = local.logs_bucket_name }
}

resource "aws_s3_bucket_ownership_controls" "logs" {
  bucket = aws_s3_bucket.logs.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "logs" {
  bucket = aws_s3_bucket.logs.id

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_versioning" "logs" {
  bucket = aws_s3_bucket.logs.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "logs" {
  bucket = aws_s3_bucket.logs.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "logs" {
  bucket = aws_s3_bucket.logs.id

  rule {
    id     = "expire-logs"
    status = "Enabled"

    filter {}

    expiration {
      days = var.access_log_retention_days
    }

    noncurrent_version_expiration {
      noncurrent_days = 30
    }

    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
  }

  depends_on = [aws_s3_bucket_versioning.logs]
}

# Regions opened before August 2022 deliver ALB logs from a regional ELB
# account; newer ones from the log-delivery service principal. Both are
# allowed, each only under the alb/ prefix.
data "aws_elb_service_account" "main" {}

data "aws_iam_policy_document" "logs_bucket" {
  statement {
    sid       = "S3ServerAccessLogs"
    effect    = "Allow"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.logs.arn}/s3/*"]

    principals {
      type        = "Service"
      identifiers = ["logging.s3.amazonaws.com"]
    }

    condition {
      test     = "ArnLike"
      variable = "aws:SourceArn"
      values   = [aws_s3_bucket.weights.arn]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }

  statement {
    sid       = "AlbAccessLogsRegionalAccount"
    effect    = "Allow"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.logs.arn}/alb/AWSLogs/${local.account_id}/*"]

    principals {
      type        = "AWS"
      identifiers = [data.aws_elb_service_account.main.arn]
    }
  }

  statement {
    sid       = "AlbAccessLogsServicePrincipal"
    effect    = "Allow"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.logs.arn}/alb/AWSLogs/${local.account_id}/*"]

    principals {
      type        = "Service"
      identifiers = ["logdelivery.elasticloadbalancing.amazonaws.com"]
    }
  }

  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.logs.arn, "${aws_s3_bucket.logs.arn}/*"]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "logs" {
  bucket = aws_s3_bucket.logs.id
  policy = data.aws_iam_policy_document.logs_bucket.json

  depends_on = [aws_s3_bucket_public_access_block.logs]
}
