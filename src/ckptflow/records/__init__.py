"""One module per on-disk record: its format, dataclass, schema validation, reader and atomic writer.

Nothing outside this package opens a record file. Each module documents its file and format;
``inventory`` holds the ``FileEntry`` list every record uses, ``_record`` the shared read/check/write
pattern (the strict JSON codec and schema loader are ``ckptflow.jsonio``).
"""

from ._record import LegacyRecord, utc_timestamp
from .declaration import FILENAME as DECLARATION_FILENAME
from .declaration import (
    Declaration,
    declaration_digest,
    parse_declaration,
    read_declaration,
    write_declaration,
)
from .inventory import FileEntry, inventory_from_list, inventory_to_list, validate_inventory
from .legacy_manifest import FILENAME as LEGACY_MANIFEST_FILENAME
from .legacy_manifest import read_legacy_manifest, write_legacy_manifest
from .manifest import FILENAME as MANIFEST_FILENAME
from .manifest import DcpComponent, FileComponent, Manifest, parse_manifest, read_manifest, write_manifest
from .materialized import FILENAME as MATERIALIZED_FILENAME
from .materialized import (
    Materialized,
    read_materialized,
    write_materialized,
)
from .merge_record import FILENAME as MERGE_RECORD_FILENAME
from .merge_record import MergeRecord, MergeRequest, read_merge_record, request_identity, write_merge_record
from .part_digests import FILENAME as PART_DIGESTS_FILENAME
from .probe import ProbeRecord, probe_record_path, read_probe_record, write_probe_record
from .receipt import FILENAME as RECEIPT_FILENAME
from .receipt import (
    CheckpointReceipt,
    NotAnArtifactReceipt,
    Receipt,
    is_legacy_receipt,
    parse_any_receipt,
    parse_receipt,
    read_any_receipt,
    read_receipt,
    write_receipt,
)
from .sizes import RECORD_NAMES, is_record, payload_bytes, payload_sizes
from .staging import FILENAME as STAGING_FILENAME
from .staging import StagingRecord, read_staging, write_staging

__all__ = [
    "DECLARATION_FILENAME",
    "LEGACY_MANIFEST_FILENAME",
    "MANIFEST_FILENAME",
    "MATERIALIZED_FILENAME",
    "MERGE_RECORD_FILENAME",
    "PART_DIGESTS_FILENAME",
    "RECEIPT_FILENAME",
    "RECORD_NAMES",
    "STAGING_FILENAME",
    "CheckpointReceipt",
    "DcpComponent",
    "Declaration",
    "FileComponent",
    "FileEntry",
    "LegacyRecord",
    "Manifest",
    "Materialized",
    "MergeRecord",
    "MergeRequest",
    "NotAnArtifactReceipt",
    "ProbeRecord",
    "Receipt",
    "StagingRecord",
    "declaration_digest",
    "inventory_from_list",
    "inventory_to_list",
    "is_legacy_receipt",
    "is_record",
    "parse_any_receipt",
    "parse_declaration",
    "parse_manifest",
    "parse_receipt",
    "payload_bytes",
    "payload_sizes",
    "probe_record_path",
    "read_any_receipt",
    "read_declaration",
    "read_legacy_manifest",
    "read_manifest",
    "read_materialized",
    "read_merge_record",
    "read_probe_record",
    "read_receipt",
    "read_staging",
    "request_identity",
    "utc_timestamp",
    "validate_inventory",
    "write_declaration",
    "write_legacy_manifest",
    "write_manifest",
    "write_materialized",
    "write_merge_record",
    "write_probe_record",
    "write_receipt",
    "write_staging",
]
