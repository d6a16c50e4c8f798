# RDS PostgreSQL in the private subnets. RDS generates the master password and
# keeps it (and rotates it) in Secrets Manager, encrypted with the data key; the
# control plane reads it at boot. Nothing outside the control-plane security
# group can reach port 5432.

locals {
  db_major_version = split(".", var.db_engine_version)[0]
}

resource "aws_db_subnet_group" "main" {
  name        = local.name
  description = "thawpool private subnets"
  subnet_ids  = aws_subnet.private[*].id

  tags = { Name = local.name }
}

resource "aws_db_parameter_group" "main" {
  name_prefix = "${local.name}-pg${local.db_major_version}-"
  family      = "postgres${local.db_major_version}"
  description = "thawpool: TLS only, statement and slow-query logging"

  parameter {
    name  = "rds.force_ssl"
    value = "1"
  }

  # DDL (migrations) is logged; ordinary reads and writes are not, to keep the
  # metering path's log volume down.
  parameter {
    name  = "log_statement"
    value = "ddl"
  }

  parameter {
    name  = "log_min_duration_statement"
    value = "1000"
  }

  parameter {
    name  = "log_connections"
    value = "1"
  }

  parameter {
    name  = "log_disconnections"
    value = "1"
  }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_db_instance" "main" {
  identifier     = local.name
  engine         = "postgres"
  engine_version = var.db_engine_version
  instance_class = var.db_instance_class

  db_name                       = var.db_name
  username                      = var.db_username
  manage_master_user_password   = true
  master_user_secret_kms_key_id = aws_kms_key.data.arn

  allocated_storage     = var.db_allocated_storage_gb
  max_allocated_storage = var.db_max_allocated_storage_gb
  storage_type          = "gp3"
  storage_encrypted     = true
  kms_key_id            = aws_kms_key.data.arn

  db_subnet_group_name   = aws_db_subnet_group.main.name
  vpc_security_group_ids = [aws_security_group.database.id]
  publicly_accessible    = false
  multi_az               = var.db_multi_az
  port                   = 5432
  parameter_group_name   = aws_db_parameter_group.main.name
  ca_cert_identifier     = "rds-ca-rsa2048-g1"

  iam_database_authentication_enabled = true

  backup_retention_period   = var.db_backup_retention_days
  backup_window             = "03:00-04:00"
  maintenance_window        = "sun:04:30-sun:05:30"
  copy_tags_to_snapshot     = true
  delete_automated_backups  = false
  deletion_protection       = var.db_deletion_protection
  skip_final_snapshot       = var.db_skip_final_snapshot
  final_snapshot_identifier = "${local.name}-final"

  auto_minor_version_upgrade  = true
  allow_major_version_upgrade = false
  apply_immediately           = false

  enabled_cloudwatch_logs_exports = ["postgresql", "upgrade"]
  monitoring_interval             = 60
  monitoring_role_arn             = aws_iam_role.rds_monitoring.arn

  performance_insights_enabled          = true
  performance_insights_kms_key_id       = aws_kms_key.data.arn
  performance_insights_retention_period = 7

  tags = { Name = local.name }

  # The log groups must exist (KMS-encrypted, with retention) before RDS
  # creates them on its own.
  depends_on = [aws_cloudwatch_log_group.rds]
}
