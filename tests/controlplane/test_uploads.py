"""Uploads without S3 credentials, against the real SeaweedFS: presigned part URLs PUT to
with httpx, a completion with the ETags, then a deploy from the uploaded model."""
import asyncio
import os
import tempfile
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from controlplane.store.tables import utcnow
from controlplane.deploy.upload_spec import plan_parts
from controlplane.deploy.uploads import EXPIRY_GRACE_S
from tests.controlplane.conftest import CATALOGUE, make_settings, running_control_plane

in_session_loop = pytest.mark.asyncio(loop_scope="session")
MIB = 1024 ** 2


def test_parts_are_planned_within_s3s_limits():
    assert plan_parts(1, 5 * MIB).part_count == 1
    plan = plan_parts(6 * MIB + 1, 5 * MIB)
    assert (plan.part_size, plan.part_count) == (5 * MIB, 2)
    assert plan.size_of(2, 6 * MIB + 1) == MIB + 1
    assert plan_parts(10, 1).part_size == 5 * MIB, "never under S3's 5 MiB"
    huge = plan_parts(200 * 1024 * MIB, 5 * MIB)
    assert huge.part_count <= 10_000 and huge.part_size * huge.part_count >= 200 * 1024 * MIB


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory, models_bucket):
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-uploads"),
                             upload_max_file_bytes=64 * MIB)
    async with running_control_plane(settings) as plane:
        yield plane


@pytest.fixture(scope="module")
def model_files(tiny_model, tmp_path_factory) -> dict[str, Path]:
    """The tiny model's files and a 6 MiB one in a subfolder (two parts of 5 MiB + 1 MiB)."""
    extra = tmp_path_factory.mktemp("upload-extra") / "padding.bin"
    extra.write_bytes(os.urandom(6 * MIB + 123))
    files = {p.name: p for p in Path(tiny_model).iterdir() if p.is_file()}
    return {**files, "extra/padding.bin": extra}


async def own_prefix(client: httpx.AsyncClient) -> str:
    sources = (await client.get("/v1/models/sources")).json()["data"]
    return next(s["prefix"] for s in sources if s["kind"] == "own")


def key_of(uri: str) -> str:
    """The object key (prefix) an s3://cp-models/... URI names."""
    return uri.removeprefix("s3://cp-models/")


def manifest(files: dict[str, Path]) -> list[dict]:
    return [{"path": path, "size": file.stat().st_size} for path, file in files.items()]


async def put_parts(upload: dict, files: dict[str, Path]) -> list[dict]:
    """PUT every part to its presigned URL, as a client without S3 credentials does."""
    done = []
    async with httpx.AsyncClient(timeout=60) as s3:
        for entry in upload["files"]:
            data = files[entry["path"]].read_bytes()
            parts = []
            for part in entry["parts"]:
                start = (part["part_number"] - 1) * entry["part_size"]
                response = await s3.put(part["url"], content=data[start:start + entry["part_size"]])
                assert response.status_code == 200, response.text
                parts.append({"part_number": part["part_number"],
                              "etag": response.headers["etag"]})
            done.append({"path": entry["path"], "parts": parts})
    return done


@in_session_loop
async def test_upload_then_deploy_the_uploaded_model(plane, model_files, s3_server):
    client = plane.client(await plane.tenant_key("uploader"))
    started = await client.post("/v1/models/uploads", json={"name": "my-llama",
                                                            "files": manifest(model_files)})
    assert started.status_code == 201, started.text
    upload = started.json()
    assert upload["model_uri"] == f"{await own_prefix(client)}my-llama/"
    assert upload["status"] == "pending"
    padding = next(f for f in upload["files"] if f["path"] == "extra/padding.bin")
    assert (padding["part_count"], len(padding["parts"])) == (2, 2)
    assert s3_server.secret_key not in started.text, "the platform's S3 credentials stay put"
    assert {tuple(sorted(f)) for f in upload["files"]} == {
        ("completed", "part_count", "part_size", "parts", "path", "size")}, \
        "no object keys or S3 upload ids beyond what each presigned URL itself names"
    done = await put_parts(upload, model_files)

    wrong = [{**f, "parts": [{**p, "etag": '"0000"'} for p in f["parts"]]} for f in done]
    refused = await client.post(f"/v1/models/uploads/{upload['id']}/complete",
                                json={"files": wrong})
    assert refused.status_code == 422 and refused.json()["error"]["param"].startswith("files[")
    short = [f if f["path"] != "extra/padding.bin" else {**f, "parts": f["parts"][:1]}
             for f in done]
    assert (await client.post(f"/v1/models/uploads/{upload['id']}/complete",
                              json={"files": short})).status_code == 422
    completed = await client.post(f"/v1/models/uploads/{upload['id']}/complete",
                                  json={"files": done})
    assert completed.status_code == 200, completed.text
    assert completed.json()["status"] == "complete"
    again = await client.post(f"/v1/models/uploads/{upload['id']}/complete", json={"files": done})
    assert again.status_code == 200, "completing twice is harmless"
    stored = s3_server.client().get_object(Bucket="cp-models",
                                           Key=f"{key_of(upload['model_uri'])}extra/padding.bin")
    assert stored["Body"].read() == model_files["extra/padding.bin"].read_bytes()

    deployed = await client.post("/v1/deployments", json={"name": "uploaded",
                                                          "model_uri": upload["model_uri"]})
    assert deployed.status_code == 201, deployed.text
    assert deployed.json()["revisions"][0]["architecture"] == "LlamaForCausalLM"
    listed = (await client.get("/v1/models/uploads")).json()["data"]
    assert [u["id"] for u in listed] == [upload["id"]] and "parts" not in listed[0]["files"][0]


@in_session_loop
async def test_upload_limits_and_isolation(plane, model_files):
    owner = plane.client(await plane.tenant_key("limits"))
    other = plane.client(await plane.tenant_key("limits-other"))
    too_big = await owner.post("/v1/models/uploads", json={"name": "x", "files": [
        {"path": "model.safetensors", "size": 64 * MIB + 1}]})
    assert too_big.status_code == 422 and too_big.json()["error"]["param"] == "files[0].size"
    for bad in ("../escape", "/abs", "a//b", "a/./b", "x" * 600):
        response = await owner.post("/v1/models/uploads", json={"name": "x", "files": [
            {"path": bad, "size": 1}]})
        assert response.status_code == 422, bad
    assert (await plane.admin.patch("/v1/tenants/limits/quota",
                                    json={"max_upload_bytes": 7 * MIB})).status_code == 200
    first = await owner.post("/v1/models/uploads", json={"name": "first", "files": [
        {"path": "a.bin", "size": 6 * MIB}]})
    assert first.status_code == 201, first.text
    over = await owner.post("/v1/models/uploads", json={"name": "second", "files": [
        {"path": "a.bin", "size": 2 * MIB}]})
    assert over.status_code == 422 and over.json()["error"]["param"] == "max_upload_bytes"
    assert (await owner.post("/v1/models/uploads", json={"name": "first", "files": [
        {"path": "b.bin", "size": 1}]})).status_code == 409
    upload_id = first.json()["id"]
    for method, path in [("GET", f"/v1/models/uploads/{upload_id}"),
                         ("POST", f"/v1/models/uploads/{upload_id}/complete"),
                         ("DELETE", f"/v1/models/uploads/{upload_id}")]:
        response = await other.request(method, path, json={"files": [
            {"path": "a.bin", "parts": [{"part_number": 1, "etag": "x"}]}]})
        assert response.status_code == 404, (method, path, response.text)
    assert (await other.get("/v1/models/uploads")).json()["data"] == []
    assert (await owner.delete(f"/v1/models/uploads/{upload_id}")).status_code == 204
    assert (await owner.post("/v1/models/uploads", json={"name": "second", "files": [
        {"path": "a.bin", "size": 2 * MIB}]})).status_code == 201, "deleting frees the quota"
    quota = (await owner.get("/v1/quota")).json()
    assert quota["usage"]["upload_bytes"] == 2 * MIB


@in_session_loop
async def test_uploads_land_in_the_tenants_namespace_by_id_never_in_a_prefix_named_alike(
        plane, s3_server):
    """A tenant named like the shared catalogue (granted to every tenant) uploads into its
    own folder under tenants/, named by its id: never into the catalogue."""
    client = plane.client(await plane.tenant_key("tiny"))           # CATALOGUE is .../tiny/
    tenants = (await plane.admin.get("/v1/tenants")).json()["data"]
    tenant_id = next(t["id"] for t in tenants if t["name"] == "tiny")
    started = await client.post("/v1/models/uploads", json={"name": "llama", "files": [
        {"path": "config.json", "size": 3}]})
    assert started.status_code == 201, started.text
    assert started.json()["model_uri"] == f"s3://cp-models/tenants/{tenant_id}/llama/"
    assert not started.json()["model_uri"].startswith(CATALOGUE)


@in_session_loop
async def test_an_upload_never_replaces_an_object(plane, s3_server):
    """409 at creation where the key holds an object; 409 at completion where one appeared
    meanwhile (S3's If-None-Match), the object kept either way."""
    client = plane.client(await plane.tenant_key("no-overwrite"))
    s3, folder = s3_server.client(), key_of(await own_prefix(client))
    s3.put_object(Bucket="cp-models", Key=f"{folder}taken/a.bin", Body=b"first")
    taken = await client.post("/v1/models/uploads", json={"name": "taken", "files": [
        {"path": "a.bin", "size": 6}]})
    assert taken.status_code == 409, taken.text
    assert taken.json()["error"]["code"] == "object_exists"

    started = await client.post("/v1/models/uploads", json={"name": "late", "files": [
        {"path": "a.bin", "size": 6}]})
    assert started.status_code == 201, started.text
    upload = started.json()
    done = await put_parts(upload, {"a.bin": _file_of(b"second")})
    s3.put_object(Bucket="cp-models", Key=f"{folder}late/a.bin", Body=b"racer!")
    refused = await client.post(f"/v1/models/uploads/{upload['id']}/complete",
                                json={"files": done})
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "object_exists"
    for key, body in ((f"{folder}taken/a.bin", b"first"), (f"{folder}late/a.bin", b"racer!")):
        assert s3.get_object(Bucket="cp-models", Key=key)["Body"].read() == body
    assert (await client.get(f"/v1/models/uploads/{upload['id']}")).json()["status"] == "pending"


@in_session_loop
async def test_a_part_url_takes_only_the_parts_length(plane):
    """Each URL signs its part's length: S3 refuses a longer (or shorter) body, so an upload
    stores no more than it declared."""
    client = plane.client(await plane.tenant_key("part-length"))
    started = await client.post("/v1/models/uploads", json={"name": "m", "files": [
        {"path": "w.bin", "size": 6 * MIB}]})
    assert started.status_code == 201, started.text
    first, last = started.json()["files"][0]["parts"]
    async with httpx.AsyncClient(timeout=60) as s3:
        assert (await s3.put(first["url"], content=b"x" * (64 * MIB))).status_code == 403
        assert (await s3.put(last["url"], content=b"x" * (MIB - 1))).status_code == 403
        assert (await s3.put(last["url"], content=b"x" * MIB)).status_code == 200


@in_session_loop
async def test_expired_multipart_uploads_are_aborted(plane, s3_server):
    client = plane.client(await plane.tenant_key("sweep"))
    s3 = s3_server.client()
    started = await client.post("/v1/models/uploads", json={"name": "stale", "files": [
        {"path": "a.bin", "size": 1}]})
    assert started.status_code == 201, started.text
    key = f"{key_of(started.json()['model_uri'])}a.bin"
    s3.put_object(Bucket="cp-models", Key="operator/in-progress.bin", Body=b"x")
    operators = s3.create_multipart_upload(Bucket="cp-models", Key="operator/big.bin")

    def pending() -> set[str]:
        return {u["Key"] for u in s3.list_multipart_uploads(Bucket="cp-models").get("Uploads", [])}

    uploads = plane.app.state.uploads
    assert key in pending()
    assert await uploads.abort_expired(utcnow()) == 0 and key in pending(), "not expired yet"
    later = utcnow() + timedelta(seconds=plane.app.state.settings.upload_ttl_s + EXPIRY_GRACE_S + 1)
    assert await uploads.abort_expired(later) >= 1
    assert key not in pending()
    assert "operator/big.bin" in pending(), "only the tenants' namespace is swept"
    s3.abort_multipart_upload(Bucket="cp-models", Key="operator/big.bin",
                              UploadId=operators["UploadId"])


@in_session_loop
async def test_the_control_plane_aborts_expired_uploads_on_its_own(db_url, s3_server,
                                                                   tmp_path_factory):
    """Uploads that expire at once (a negative lifetime past the grace), swept every 0.2 s."""
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-sweeper"),
                             upload_ttl_s=-EXPIRY_GRACE_S - 60, upload_sweep_s=0.2)
    async with running_control_plane(settings) as swept:
        client = swept.client(await swept.tenant_key("swept"))
        started = await client.post("/v1/models/uploads", json={"name": "gone", "files": [
            {"path": "a.bin", "size": 1}]})
        assert started.status_code == 201, started.text
        key = f"{key_of(started.json()['model_uri'])}a.bin"
        s3 = s3_server.client()
        for _ in range(100):
            keys = {u["Key"] for u in
                    s3.list_multipart_uploads(Bucket="cp-models").get("Uploads", [])}
            if key not in keys:
                return
            await asyncio.sleep(0.1)
        raise AssertionError("the expired multipart upload was never aborted")


def _file_of(data: bytes) -> Path:
    path = Path(tempfile.mkdtemp()) / "data.bin"
    path.write_bytes(data)
    return path
