"""Names and labels Kubernetes accepts, made from names and ids it may not.

Pod and Service names are DNS-1035 labels (at most 63 characters, a letter first) because a pod's hostname
and its headless Service together form the DNS name other replicas reach it by. Long job names are
truncated and a hash of the job id and attempt keeps them unique. A volume's claim (and PersistentVolume) is
named the same way, from its tenant and name, with a hash of them and of the volume's creation: the same volume
always gets the same claim, and a volume deleted and made again under its name gets a new one.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from gpuyard.shared.contracts.jobspec import MAX_REPLICAS

DNS_LABEL_MAX = 63
LABEL_VALUE_MAX = 63
_NOT_DNS = re.compile(r"[^a-z0-9-]+")
_NOT_LABEL = re.compile(r"[^A-Za-z0-9_.-]+")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_REPLICA_SUFFIX_MAX = len(f"-r{MAX_REPLICAS - 1}")


def short_hash(*parts: object, length: int = 8) -> str:
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()[:length]


def dns_slug(text: str) -> str:
    """Lowercase letters, digits and single dashes; no dash at either end. May be empty."""
    return re.sub(r"-{2,}", "-", _NOT_DNS.sub("-", text.lower())).strip("-")


def label_value(value: str) -> str:
    """`value` when it is a valid label value, otherwise a readable prefix of it plus a hash of all of it."""
    if len(value) <= LABEL_VALUE_MAX and _LABEL_VALUE.match(value):
        return value
    tail = short_hash(value, length=10)
    head = _NOT_LABEL.sub("-", value)[: LABEL_VALUE_MAX - len(tail) - 1]
    head = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", head)
    return f"{head}-{tail}" if head else f"h{tail}"


@dataclass(frozen=True)
class AttemptNames:
    """Object names of one attempt of one job."""

    base: str

    @property
    def service(self) -> str:
        return self.base

    def pod(self, replica: int) -> str:
        return f"{self.base}-r{replica}"


def attempt_names(prefix: str, job_name: str, job_id: str, attempt: int) -> AttemptNames:
    """`<prefix>-<job name>-<hash>-a<attempt>`, the job name cut so that `-r<replica>` still fits in 63."""
    tail = f"-{short_hash(job_id, attempt)}-a{attempt}"
    room = DNS_LABEL_MAX - _REPLICA_SUFFIX_MAX - len(tail) - len(prefix) - 1
    slug = dns_slug(job_name)[:room].strip("-")
    return AttemptNames(base=f"{prefix}-{slug}{tail}" if slug else f"{prefix}{tail}")


def volume_claim_name(prefix: str, tenant: str, volume: str, created: str) -> str:
    """`<prefix>-<tenant>-<volume>-<hash>` (cut to 63), the claim of the volume `tenant`/`volume` made at
    `created` (its creation time, ISO): unique, and the same for the same volume."""
    return _volume_object_name(prefix, tenant, volume, created)


def persistent_volume_name(prefix: str, namespace: str, tenant: str, volume: str, created: str) -> str:
    """The PersistentVolume of that claim: cluster-scoped, so the hash also covers the claim's namespace (two
    installations in one cluster never share a name)."""
    return _volume_object_name(prefix, tenant, volume, created, namespace)


def _volume_object_name(prefix: str, tenant: str, volume: str, *hashed: str) -> str:
    tail = f"-{short_hash(tenant, volume, *hashed, length=10)}"
    room = DNS_LABEL_MAX - len(prefix) - 1 - len(tail)
    slug = dns_slug(f"{tenant}-{volume}")[:room].strip("-")
    return f"{prefix}-{slug}{tail}" if slug else f"{prefix}{tail}"
