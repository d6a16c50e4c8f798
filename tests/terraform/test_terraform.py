"""Offline checks of terraform/: fmt, init + validate, boot scripts, checkov.

Nothing here reaches the network or AWS:
- `terraform init` runs in a temporary copy of terraform/ against a local
  provider mirror (-plugin-dir), so no .terraform/ or lock file is ever left in
  the repository;
- checkov runs with --skip-download and no API key.

Each test skips, naming what is absent, where the terraform binary, the
provider mirror or the checkov venv (.venv-scan, `make setup`) is missing.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TF_DIR = REPO / "terraform"
DOC = REPO / "docs" / "terraform.md"
CHECKOV = REPO / ".venv-scan" / "bin" / "checkov"
SCAN_PYTHON = REPO / ".venv-scan" / "bin" / "python"

# Folders that may hold a provider mirror (the folder containing
# registry.terraform.io/), searched a few levels deep.
MIRROR_ROOTS = [
    Path("/opt"),
    Path("/usr/local/share"),
    Path("/usr/share"),
    Path.home() / ".terraform.d",
]
MIRROR_MAX_DEPTH = 3

# Every check that must have passed, on the resource it guards.
REQUIRED_PASSES = {
    ("CKV_AWS_16", "aws_db_instance.main"),  # storage encrypted
    ("CKV_AWS_17", "aws_db_instance.main"),  # not publicly accessible
    ("CKV_AWS_133", "aws_db_instance.main"),  # backups
    ("CKV_AWS_293", "aws_db_instance.main"),  # deletion protection
    ("CKV_AWS_145", "aws_s3_bucket.weights"),  # KMS encryption
    ("CKV_AWS_21", "aws_s3_bucket.weights"),  # versioning
    ("CKV_AWS_18", "aws_s3_bucket.weights"),  # access logging
    ("CKV2_AWS_6", "aws_s3_bucket.weights"),  # public access block
    ("CKV2_AWS_20", "aws_lb.main"),  # HTTP -> HTTPS redirect
    ("CKV2_AWS_28", "aws_lb.main"),  # WAF
    ("CKV_AWS_91", "aws_lb.main"),  # ALB access logs
    ("CKV_AWS_103", "aws_lb_listener.https"),  # TLS >= 1.2
    ("CKV_AWS_79", "aws_launch_template.gpu_node"),  # IMDSv2 only
    ("CKV_AWS_79", "aws_launch_template.control_plane"),
    ("CKV_AWS_88", "aws_launch_template.gpu_node"),  # no public IP
    ("CKV_AWS_88", "aws_launch_template.control_plane"),
    ("CKV_AWS_46", "aws_launch_template.gpu_node"),  # no secrets in user data
    ("CKV_AWS_46", "aws_launch_template.control_plane"),
    ("CKV_AWS_158", "aws_cloudwatch_log_group.gpu_nodes"),  # KMS
    ("CKV_AWS_158", "aws_cloudwatch_log_group.control_plane"),
    ("CKV_AWS_338", "aws_cloudwatch_log_group.gpu_nodes"),  # retention
    ("CKV2_AWS_11", "aws_vpc.main"),  # flow logs
    ("CKV2_AWS_12", "aws_vpc.main"),  # default SG closed
    ("CKV_AWS_7", "aws_kms_key.data"),  # key rotation
    ("CKV_AWS_7", "aws_kms_key.logs"),
    ("CKV_AWS_3", "aws_ebs_volume.outbox"),  # the usage outbox encrypted
    ("CKV_AWS_189", "aws_ebs_volume.outbox"),  # with the data key
}

# The only actions a GPU node's role may have.
GPU_NODE_ALLOWED_ACTIONS = {
    "s3:ListBucket",
    "s3:GetBucketLocation",
    "s3:GetObject",
    "s3:GetObjectVersion",
    "kms:Decrypt",
    "logs:CreateLogStream",
    "logs:PutLogEvents",
    "logs:DescribeLogStreams",
}


# ---------------------------------------------------------------------------
# Locating the tools
# ---------------------------------------------------------------------------


def _terraform() -> str:
    path = shutil.which("terraform") or "/usr/local/bin/terraform"
    if not os.access(path, os.X_OK):
        pytest.skip("terraform binary not found (not on PATH, not /usr/local/bin/terraform)")
    return path


def _platform_dir() -> str:
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
    return f"{platform.system().lower()}_{arch.get(platform.machine().lower(), platform.machine())}"


def find_provider_mirror() -> Path | None:
    """The folder holding registry.terraform.io/ with an AWS provider binary.

    Found by the binary's name terraform-provider-aws_* for this platform, in
    THAWPOOL_TF_PLUGIN_DIR if set, else under MIRROR_ROOTS.
    """
    pattern = f"registry.terraform.io/hashicorp/aws/*/{_platform_dir()}/terraform-provider-aws_*"
    explicit = os.environ.get("THAWPOOL_TF_PLUGIN_DIR")
    roots = [Path(explicit)] if explicit else MIRROR_ROOTS
    for root in roots:
        if not root.is_dir():
            continue
        for depth in range(MIRROR_MAX_DEPTH + 1):
            for binary in sorted(root.glob("*/" * depth + pattern)):
                if binary.is_file() and os.access(binary, os.X_OK):
                    return binary.parents[5]  # <mirror>/registry.terraform.io/hashicorp/aws/<v>/<os_arch>/
    return None


def _mirror() -> Path:
    mirror = find_provider_mirror()
    if mirror is None:
        explicit = os.environ.get("THAWPOOL_TF_PLUGIN_DIR")
        where = f"THAWPOOL_TF_PLUGIN_DIR={explicit}" if explicit else ", ".join(str(r) for r in MIRROR_ROOTS)
        pytest.skip(f"hashicorp/aws provider mirror not found (no terraform-provider-aws_* for {_platform_dir()} under {where})")
    return mirror


def _checkov() -> Path:
    if not os.access(CHECKOV, os.X_OK):
        pytest.skip(f"checkov venv not found ({CHECKOV}; `make setup` creates it)")
    return CHECKOV


def _tf_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    cli_config = tmp / "terraformrc"
    cli_config.write_text("")  # no credentials, no provider_installation overrides
    env.update(
        TF_CLI_CONFIG_FILE=str(cli_config),
        TF_IN_AUTOMATION="1",
        TF_INPUT="0",
        CHECKPOINT_DISABLE="1",
    )
    return env


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------
# Fixtures: one init'ed copy and one checkov run per module
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tf_work(tmp_path_factory) -> tuple[Path, dict[str, str], str]:
    """A temporary copy of terraform/ after `terraform init -backend=false`."""
    terraform = _terraform()
    mirror = _mirror()
    tmp = tmp_path_factory.mktemp("tf")
    work = tmp / "terraform"
    shutil.copytree(
        TF_DIR, work, ignore=shutil.ignore_patterns(".terraform", ".terraform.lock.hcl", "*.tfstate*", "*.tfplan")
    )
    env = _tf_env(tmp)
    proc = _run(
        [terraform, "init", "-backend=false", "-input=false", "-no-color", f"-plugin-dir={mirror}"],
        cwd=work,
        env=env,
    )
    assert proc.returncode == 0, f"terraform init failed:\n{proc.stdout}\n{proc.stderr}"
    return work, env, terraform


def _start_checkov(tmp: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BC_", "PRISMA_", "CKV_"))}
    env.update(
        CHECKOV_RUN_SCA_PACKAGE_SCAN_V2="false",
        LOG_LEVEL="ERROR",
        HOME=str(tmp),  # checkov caches under ~; keep it out of the real home
    )
    cmd = [
        str(CHECKOV),
        "--framework", "terraform",
        "--compact",
        "--skip-download",
        "--download-external-modules", "false",
        "-d", str(TF_DIR),
        "-o", "json",
    ]
    # Output goes to files: a pipe nobody reads yet would stall checkov.
    with open(tmp / "report.json", "w") as out, open(tmp / "stderr.txt", "w") as err:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=err)


@pytest.fixture(scope="module", autouse=True)
def _checkov_in_background(request, tmp_path_factory):
    """Start checkov as soon as the module starts, so it runs while terraform validates."""
    wanted = any("checkov_report" in getattr(item, "fixturenames", ()) for item in request.session.items)
    if not wanted or not os.access(CHECKOV, os.X_OK):
        yield None
        return
    tmp = tmp_path_factory.mktemp("checkov")
    proc = _start_checkov(tmp)
    yield proc, tmp
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def checkov_report(_checkov_in_background) -> dict:
    _checkov()
    proc, tmp = _checkov_in_background
    try:
        proc.wait(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("checkov ran for more than 180 s")
    stdout = (tmp / "report.json").read_text()
    try:
        report = json.loads(stdout)
    except json.JSONDecodeError:
        stderr = (tmp / "stderr.txt").read_text()
        pytest.fail(f"checkov gave no JSON report (rc {proc.returncode}):\n{stdout[-3000:]}\n{stderr[-3000:]}")
    reports = report if isinstance(report, list) else [report]
    (tf_report,) = [r for r in reports if r.get("check_type") == "terraform"]
    return tf_report


# ---------------------------------------------------------------------------
# terraform
# ---------------------------------------------------------------------------


def test_fmt_check(tmp_path):
    terraform = _terraform()
    proc = _run([terraform, "fmt", "-check", "-recursive", "-diff", "-no-color", str(TF_DIR)], cwd=REPO, env=_tf_env(tmp_path))
    assert proc.returncode == 0, f"terraform fmt would change files:\n{proc.stdout}\n{proc.stderr}"


def test_init_installs_provider_from_mirror(tf_work):
    work, _, _ = tf_work
    lock = (work / ".terraform.lock.hcl").read_text()
    version = re.search(r'provider "registry.terraform.io/hashicorp/aws" \{\s*version\s*=\s*"([^"]+)"', lock)
    assert version, lock
    assert version.group(1).startswith("5."), f"unexpected aws provider {version.group(1)}"
    assert not (TF_DIR / ".terraform").exists() and not (TF_DIR / ".terraform.lock.hcl").exists()


def test_validate(tf_work):
    work, env, terraform = tf_work
    proc = _run([terraform, "validate", "-json", "-no-color"], cwd=work, env=env)
    result = json.loads(proc.stdout)
    messages = [f"{d['severity']}: {d['summary']} {d.get('detail', '')}" for d in result["diagnostics"]]
    assert result["valid"], "\n".join(messages)
    assert result["warning_count"] == 0, "\n".join(messages)


def _render(terraform: str, tmp: Path, template: str, variables: dict) -> str:
    """Render a boot-script template with terraform's own templatefile()."""
    expr = f"templatefile({json.dumps(str(TF_DIR / 'templates' / template))}, {json.dumps(variables)})"
    proc = subprocess.run(
        [terraform, "console"], input=f"jsonencode({expr})\n", cwd=tmp, env=_tf_env(tmp),
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, f"rendering {template} failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(json.loads(proc.stdout))


COMMON_VARS = {
    "region": "us-east-1",
    "install_spec": "thawpool[ray]==0.1.0",
    "ray_version": "2.60.0",
    "weights_bucket": "thawpool-prod-weights-123456789012",
    "ray_head_fqdn": "ray-head.thawpool-prod.internal",
    "cloudwatch_agent_config": json.dumps({"logs": {}}),
}


@pytest.mark.parametrize(
    "template, extra",
    [
        (
            "control_plane_user_data.sh.tftpl",
            {
                "db_host": "db.example.internal",
                "db_port": 5432,
                "db_name": "thawpool",
                "db_secret_arn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:rds!db-1",
                "zone_id": "Z0123456789",
                "gpu_memory_gb": 24,
                "control_plane_args": "'up' '--s3-endpoint' 'aws' '--backend' 'ray' '--ray-address' 'auto'",
                "outbox_volume_id": "vol-0123456789abcdef0",
            },
        ),
        ("gpu_node_user_data.sh.tftpl", {"install_spec": "s3://b/artifacts/thawpool-0.1.0-py3-none-any.whl"}),
    ],
)
def test_boot_scripts_render_and_parse(tmp_path, template, extra):
    terraform = _terraform()
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash not found")
    script = _render(terraform, tmp_path, template, {**COMMON_VARS, **extra})
    assert script.startswith("#!/bin/bash\n")
    assert "ray-head.thawpool-prod.internal" in script
    assert not re.search(r"password\s*=", script, re.IGNORECASE), "no secret may be rendered into user data"
    path = tmp_path / "boot.sh"
    path.write_text(script)
    proc = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------
# checkov
# ---------------------------------------------------------------------------


def _pairs(checks: list[dict]) -> set[tuple[str, str]]:
    return {(c["check_id"], c["resource"]) for c in checks}


def test_checkov_has_no_failed_checks(checkov_report):
    results = checkov_report["results"]
    failed = [f"{c['check_id']} {c['resource']} ({c['file_path']}): {c['check_name']}" for c in results["failed_checks"]]
    assert not failed, "checkov findings (fix, or skip inline with a reason and document in docs/terraform.md):\n" + "\n".join(failed)
    assert not results["parsing_errors"], results["parsing_errors"]
    assert checkov_report["summary"]["resource_count"] >= 50, "checkov scanned far fewer resources than terraform/ holds"


def test_checkov_key_security_properties_pass(checkov_report):
    passed = _pairs(checkov_report["results"]["passed_checks"])
    missing = sorted(REQUIRED_PASSES - passed)
    assert not missing, f"these checks did not pass: {missing}"


def test_checkov_skips_are_explained_inline_and_in_docs(checkov_report):
    skipped = checkov_report["results"]["skipped_checks"]
    doc = DOC.read_text()
    for check in skipped:
        reason = (check.get("check_result") or {}).get("suppress_comment", "")
        assert len(reason) > 20, f"{check['check_id']} on {check['resource']} is skipped without a reason"
        assert check["check_id"] in doc, f"{check['check_id']} ({check['resource']}) is skipped but not explained in docs/terraform.md"


# ---------------------------------------------------------------------------
# Least privilege, read from the configuration itself
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hcl() -> dict[str, dict]:
    """iam.tf, database.tf, variables.tf and control_plane.tf parsed with python-hcl2 from
    the checkov venv."""
    if not os.access(SCAN_PYTHON, os.X_OK):
        pytest.skip(f"checkov venv not found ({SCAN_PYTHON}; it provides the HCL parser)")
    names = ["iam.tf", "database.tf", "variables.tf", "control_plane.tf"]
    code = "import hcl2, json, sys; print(json.dumps({p: hcl2.load(open(p)) for p in sys.argv[1:]}))"
    proc = subprocess.run([str(SCAN_PYTHON), "-c", code, *names], cwd=TF_DIR, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _policy_document(parsed: dict, name: str) -> dict:
    for block in parsed.get("data", []):
        doc = block.get("aws_iam_policy_document", {})
        if name in doc:
            return doc[name]
    raise AssertionError(f"data.aws_iam_policy_document.{name} not found")


# python-hcl2 before 5.0 wraps every attribute value in a one-element list;
# these two accessors read both shapes.
def _scalar(block: dict, key: str, default=None):
    value = block.get(key, default)
    return value[0] if isinstance(value, list) and value else value


def _strings(block: dict, key: str) -> list[str]:
    value = block.get(key, [])
    return value[0] if value and isinstance(value[0], list) else value


def test_gpu_node_role_only_reads_weights_and_writes_logs(hcl):
    parsed = hcl["iam.tf"]
    statements = _policy_document(parsed, "gpu_node")["statement"]
    actions = {a for s in statements for a in _strings(s, "actions")}
    assert actions <= GPU_NODE_ALLOWED_ACTIONS, f"extra actions on GPU nodes: {sorted(actions - GPU_NODE_ALLOWED_ACTIONS)}"
    # and it does read weights and write logs: an empty parse (an HCL shape this test
    # does not read) would pass the subset check above with nothing checked
    needed = {"s3:ListBucket", "s3:GetObject", "logs:CreateLogStream", "logs:PutLogEvents"}
    assert needed <= actions, f"GPU nodes miss {sorted(needed - actions)}"
    for s in statements:
        assert _scalar(s, "effect", "Allow") == "Allow"
        assert "*" not in _strings(s, "resources"), f"statement {_scalar(s, 'sid')} has Resource *"
        if "kms:Decrypt" in _strings(s, "actions"):
            (condition,) = s["condition"]
            assert _scalar(condition, "variable") == "kms:ViaService", "GPU nodes may decrypt only through S3"


def test_control_plane_role_is_scoped(hcl):
    parsed = hcl["iam.tf"]
    statements = _policy_document(parsed, "control_plane")["statement"]
    for s in statements:
        sid = _scalar(s, "sid")
        assert "*" not in _strings(s, "resources"), f"statement {sid} has Resource *"
        assert not any(a.endswith(":*") or a == "*" for a in _strings(s, "actions")), f"wildcard action in {sid}"
    secret_reads = [s for s in statements if "secretsmanager:GetSecretValue" in _strings(s, "actions")]
    assert len(secret_reads) == 1 and _strings(secret_reads[0], "resources") == ["${local.db_secret_arn}"]


def _resource(parsed: dict, kind: str, name: str) -> dict:
    for block in parsed["resource"]:
        if name in block.get(kind, {}):
            return block[kind][name]
    raise AssertionError(f"{kind}.{name} not found")


def test_the_usage_outbox_outlives_the_control_plane_instance(hcl, tmp_path):
    """The outbox is on an EBS volume of its own (the root volume goes with the instance),
    encrypted with the data key, in the one zone the control plane is launched in; the boot
    script attaches and mounts it and points THAWPOOL_OUTBOX_DIR at it; the node may attach
    that volume and no other."""
    parsed = hcl["control_plane.tf"]
    volume = _resource(parsed, "aws_ebs_volume", "outbox")
    assert _scalar(volume, "encrypted") is True and _scalar(volume, "kms_key_id") == "${aws_kms_key.data.arn}"
    assert _scalar(volume, "availability_zone") == "${local.azs[0]}"
    group = _resource(parsed, "aws_autoscaling_group", "control_plane")
    assert _strings(group, "vpc_zone_identifier") == ["${aws_subnet.private[0].id}"], "the volume's zone only"
    template = _resource(parsed, "aws_launch_template", "control_plane")
    assert "aws_ebs_volume.outbox.id" in json.dumps(template["user_data"])
    statements = _policy_document(hcl["iam.tf"], "control_plane")["statement"]
    (attach,) = [st for st in statements if "ec2:AttachVolume" in _strings(st, "actions")]
    volumes = [r for r in _strings(attach, "resources") if ":volume/" in r or "ebs_volume" in r]
    assert volumes == ["${aws_ebs_volume.outbox.arn}"]
    terraform = _terraform()
    script = _render(terraform, tmp_path, "control_plane_user_data.sh.tftpl", {
        **COMMON_VARS, "db_host": "h", "db_port": 5432, "db_name": "d", "db_secret_arn": "arn:s",
        "zone_id": "Z", "gpu_memory_gb": 24, "control_plane_args": "'up'",
        "outbox_volume_id": "vol-0123456789abcdef0"})
    assert "--volume-id \"$outbox_volume\"" in script and "outbox_volume='vol-0123456789abcdef0'" in script
    assert "THAWPOOL_OUTBOX_DIR=/var/lib/thawpool/outbox" in script
    assert script.index("mount /var/lib/thawpool/outbox") < script.index("systemctl enable")


def test_database_is_private_encrypted_and_tls_only(hcl):
    parsed = hcl["database.tf"]
    db = params = None
    for block in parsed["resource"]:
        db = block.get("aws_db_instance", {}).get("main", db)
        params = block.get("aws_db_parameter_group", {}).get("main", params)
    assert db is not None and params is not None
    assert _scalar(db, "publicly_accessible") is False
    assert _scalar(db, "storage_encrypted") is True
    assert _scalar(db, "manage_master_user_password") is True, "the password must be generated and kept by RDS in Secrets Manager"
    assert "password" not in db, "no password may be written in the configuration"
    assert _scalar(db, "deletion_protection") == "${var.db_deletion_protection}"
    force_ssl = [p for p in params["parameter"] if _scalar(p, "name") == "rds.force_ssl"]
    assert force_ssl and _scalar(force_ssl[0], "value") == "1"
    variables = hcl["variables.tf"]
    (deletion_protection,) = [v["db_deletion_protection"] for v in variables["variable"] if "db_deletion_protection" in v]
    assert _scalar(deletion_protection, "default") is True
