# VPC with public subnets (ALB, NAT gateways) and private subnets (everything
# else). Nothing but the ALB and the NAT gateways has a public address.

locals {
  wanted_azs = length(var.availability_zones) > 0 ? var.availability_zones : ["${var.region}a", "${var.region}b"]
}

# The zones are named, not discovered, so that a zone AWS adds later never
# changes the subnet layout of an existing deployment. The data source checks
# that the named zones exist and are available.
data "aws_availability_zones" "selected" {
  state = "available"

  filter {
    name   = "zone-name"
    values = local.wanted_azs
  }

  lifecycle {
    postcondition {
      condition     = length(self.names) == length(local.wanted_azs)
      error_message = "Some of the availability zones ${join(", ", local.wanted_azs)} do not exist or are not available in this region; set var.availability_zones."
    }
  }
}

locals {
  azs      = local.wanted_azs
  az_count = length(local.wanted_azs)

  # /20 public subnets at the start of the VPC, /18 private subnets after them
  # (the GPU nodes and the database live there).
  public_subnet_cidrs  = [for i in range(local.az_count) : cidrsubnet(var.vpc_cidr, 4, i)]
  private_subnet_cidrs = [for i in range(local.az_count) : cidrsubnet(var.vpc_cidr, 2, i + 1)]

  nat_gateway_count = var.single_nat_gateway ? 1 : local.az_count
}

resource "aws_vpc" "main" {
  cidr_block           = var.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = true

  tags = { Name = local.name }
}

# Lock down the default security group: no rules at all, so nothing can use it
# by accident.
resource "aws_default_security_group" "default" {
  vpc_id = aws_vpc.main.id

  tags = { Name = "${local.name}-default-unused" }
}

resource "aws_internet_gateway" "main" {
  vpc_id = aws_vpc.main.id

  tags = { Name = local.name }
}

resource "aws_subnet" "public" {
  count = local.az_count

  vpc_id            = aws_vpc.main.id
  cidr_block        = local.public_subnet_cidrs[count.index]
  availability_zone = local.azs[count.index]
  # The ALB and NAT gateways get their addresses explicitly; no instance is
  # ever given a public IP by default.
  map_public_ip_on_launch = false

  tags = { Name = "${local.name}-public-${local.azs[count.index]}", Tier = "public" }
}

resource "aws_subnet" "private" {
  count = local.az_count

  vpc_id                  = aws_vpc.main.id
  cidr_block              = local.private_subnet_cidrs[count.index]
  availability_zone       = local.azs[count.index]
  map_public_ip_on_launch = false

  tags = { Name = "${local.name}-private-${local.azs[count.index]}", Tier = "private" }
}

resource "aws_eip" "nat" {
  count  = local.nat_gateway_count
  domain = "vpc"

  tags = { Name = "${local.name}-nat-${count.index}" }

  depends_on = [aws_internet_gateway.main]
}

resource "aws_nat_gateway" "main" {
  count = local.nat_gateway_count

  allocation_id = aws_eip.nat[count.index].id
  subnet_id     = aws_subnet.public[count.index].id

  tags = { Name = "${local.name}-${local.azs[count.index]}" }

  depends_on = [aws_internet_gateway.main]
}

resource "aws_route_table" "public" {
  vpc_id = aws_vpc.main.id

  tags = { Name = "${local.name}-public" }
}

resource "aws_route" "public_internet" {
  route_table_id         = aws_route_table.public.id
  destination_cidr_block = "0.0.0.0/0"
  gateway_id             = aws_internet_gateway.main.id
}

resource "aws_route_table_association" "public" {
  count = local.az_count

  subnet_id      = aws_subnet.public[count.index].id
  route_table_id = aws_route_table.public.id
}

resource "aws_route_table" "private" {
  count = local.az_count

  vpc_id = aws_vpc.main.id

  tags = { Name = "${local.name}-private-${local.azs[count.index]}" }
}

resource "aws_route" "private_nat" {
  count = local.az_count

  route_table_id         = aws_route_table.private[count.index].id
  destination_cidr_block = "0.0.0.0/0"
  nat_gateway_id         = aws_nat_gateway.main[var.single_nat_gateway ? 0 : count.index].id
}

resource "aws_route_table_association" "private" {
  count = local.az_count

  subnet_id      = aws_subnet.private[count.index].id
  route_table_id = aws_route_table.private[count.index].id
}

# S3 traffic (weights downloads, by far the largest flow) stays on the AWS
# network and skips the NAT gateways' per-GB charge.
resource "aws_vpc_endpoint" "s3" {
  vpc_id            = aws_vpc.main.id
  service_name      = "com.amazonaws.${local.region}.s3"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = aws_route_table.private[*].id

  tags = { Name = "${local.name}-s3" }
}

# ---------------------------------------------------------------------------
# VPC flow logs
# ---------------------------------------------------------------------------

resource "aws_flow_log" "vpc" {
  vpc_id                   = aws_vpc.main.id
  traffic_type             = "ALL"
  log_destination_type     = "cloud-watch-logs"
  log_destination          = aws_cloudwatch_log_group.flow_logs.arn
  iam_role_arn             = aws_iam_role.flow_logs.arn
  max_aggregation_interval = 60

  tags = { Name = "${local.name}-vpc" }
}

# ---------------------------------------------------------------------------
# Security groups. Every rule is its own resource with a description.
# ---------------------------------------------------------------------------

resource "aws_security_group" "alb" {
  name        = "${local.name}-alb"
  description = "thawpool ALB: HTTPS from clients, HTTP only to redirect"
  vpc_id      = aws_vpc.main.id

  tags = { Name = "${local.name}-alb" }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "alb_https" {
  for_each = toset(var.alb_ingress_cidrs)

  security_group_id = aws_security_group.alb.id
  description       = "HTTPS from clients"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = each.value
}

resource "aws_vpc_security_group_ingress_rule" "alb_http_redirect" {
  #checkov:skip=CKV_AWS_260:Port 80 is open only for the listener that answers every request with a 301 to HTTPS; no request reaches the control plane over HTTP.
  for_each = toset(var.alb_ingress_cidrs)

  security_group_id = aws_security_group.alb.id
  description       = "HTTP from clients, answered only with a redirect to HTTPS"
  ip_protocol       = "tcp"
  from_port         = 80
  to_port           = 80
  cidr_ipv4         = each.value
}

resource "aws_vpc_security_group_egress_rule" "alb_to_control_plane" {
  security_group_id            = aws_security_group.alb.id
  description                  = "Forward to the control plane"
  ip_protocol                  = "tcp"
  from_port                    = var.control_plane_port
  to_port                      = var.control_plane_port
  referenced_security_group_id = aws_security_group.control_plane.id
}

# The control-plane node: the thawpool API (reached from the ALB) and the Ray
# head (reached from the GPU nodes through the cluster group below).
resource "aws_security_group" "control_plane" {
  name        = "${local.name}-control-plane"
  description = "thawpool control plane: API from the ALB"
  vpc_id      = aws_vpc.main.id

  tags = { Name = "${local.name}-control-plane" }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "control_plane_from_alb" {
  security_group_id            = aws_security_group.control_plane.id
  description                  = "thawpool API from the ALB"
  ip_protocol                  = "tcp"
  from_port                    = var.control_plane_port
  to_port                      = var.control_plane_port
  referenced_security_group_id = aws_security_group.alb.id
}

resource "aws_vpc_security_group_egress_rule" "control_plane_to_db" {
  security_group_id            = aws_security_group.control_plane.id
  description                  = "PostgreSQL"
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
  referenced_security_group_id = aws_security_group.database.id
}

# Ray has no authentication of its own: every Ray process (head, workers,
# runtime replicas) is reachable only from members of this group, which are
# the control-plane node and the GPU nodes.
resource "aws_security_group" "ray_cluster" {
  name        = "${local.name}-ray-cluster"
  description = "Ray cluster members: all TCP between members, HTTPS out"
  vpc_id      = aws_vpc.main.id

  tags = { Name = "${local.name}-ray-cluster" }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "ray_cluster_self" {
  #checkov:skip=CKV_AWS_24:False positive: the source is this security group itself (referenced_security_group_id), not 0.0.0.0/0; checkov only recognises self-references on the older rule resources.
  #checkov:skip=CKV_AWS_25:False positive, as for CKV_AWS_24: the source is this security group, not 0.0.0.0/0.
  #checkov:skip=CKV_AWS_260:False positive, as for CKV_AWS_24: the source is this security group, not 0.0.0.0/0.
  security_group_id            = aws_security_group.ray_cluster.id
  description                  = "Ray GCS, raylets, object store and runtime replicas between cluster members"
  ip_protocol                  = "tcp"
  from_port                    = 0
  to_port                      = 65535
  referenced_security_group_id = aws_security_group.ray_cluster.id
}

resource "aws_vpc_security_group_egress_rule" "ray_cluster_self" {
  security_group_id            = aws_security_group.ray_cluster.id
  description                  = "Ray and runtime replicas between cluster members"
  ip_protocol                  = "tcp"
  from_port                    = 0
  to_port                      = 65535
  referenced_security_group_id = aws_security_group.ray_cluster.id
}

resource "aws_vpc_security_group_egress_rule" "ray_cluster_s3" {
  security_group_id = aws_security_group.ray_cluster.id
  description       = "S3 through the gateway endpoint (model weights)"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  prefix_list_id    = aws_vpc_endpoint.s3.prefix_list_id
}

resource "aws_vpc_security_group_egress_rule" "ray_cluster_https" {
  security_group_id = aws_security_group.ray_cluster.id
  description       = "HTTPS through the NAT gateways: AWS APIs (logs, secrets), package installs at boot"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = "0.0.0.0/0"
}

resource "aws_security_group" "database" {
  name        = "${local.name}-database"
  description = "thawpool PostgreSQL: only from the control plane"
  vpc_id      = aws_vpc.main.id

  tags = { Name = "${local.name}-database" }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "database_from_control_plane" {
  security_group_id            = aws_security_group.database.id
  description                  = "PostgreSQL from the control plane"
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
  referenced_security_group_id = aws_security_group.control_plane.id
}
