"""tests/security runs hostile tenants' packages on the real pool; the function tests'
package fixtures serve here too."""
from tests.functions.conftest import probe_package  # noqa: F401 - shared fixture
