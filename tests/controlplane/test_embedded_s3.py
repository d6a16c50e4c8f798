"""The embedded SeaweedFS is stopped with a short grace, then SIGKILL (controlplane/embedded/
s3.py: its own SIGTERM path takes 25 s). What it acknowledged before the stop is served,
whole, by the next weed on the same data dir: objects, a multipart upload's parts joined,
a deletion."""
from __future__ import annotations

import os

from controlplane.embedded import EmbeddedS3

BUCKET = "kept-across-stops"


def test_what_weed_acknowledged_is_there_after_a_stop(tmp_path):
    small, large = os.urandom(1000), os.urandom(6 << 20)
    with EmbeddedS3(tmp_path / "s3") as first:
        first.ensure_bucket(BUCKET)
        client = first.client()
        client.put_object(Bucket=BUCKET, Key="small", Body=small)
        client.put_object(Bucket=BUCKET, Key="gone", Body=b"x")
        client.delete_object(Bucket=BUCKET, Key="gone")
        upload = client.create_multipart_upload(Bucket=BUCKET, Key="large")["UploadId"]
        parts = [client.upload_part(Bucket=BUCKET, Key="large", UploadId=upload, PartNumber=n,
                                    Body=large[(n - 1) * (5 << 20):n * (5 << 20)])["ETag"] for n in (1, 2)]
        client.complete_multipart_upload(Bucket=BUCKET, Key="large", UploadId=upload, MultipartUpload={
            "Parts": [{"ETag": etag, "PartNumber": n} for n, etag in zip((1, 2), parts)]})
    assert first.process is None
    with EmbeddedS3(tmp_path / "s3") as second:
        client = second.client()
        assert client.get_object(Bucket=BUCKET, Key="small")["Body"].read() == small
        assert client.get_object(Bucket=BUCKET, Key="large")["Body"].read() == large
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
        assert sorted(keys) == ["large", "small"]
