from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PriorityClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_CLASS_UNSPECIFIED: _ClassVar[PriorityClass]
    PRIORITY_CLASS_STANDARD: _ClassVar[PriorityClass]
    PRIORITY_CLASS_PREMIUM: _ClassVar[PriorityClass]
    PRIORITY_CLASS_VIP: _ClassVar[PriorityClass]

class RefusalReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REFUSAL_REASON_UNSPECIFIED: _ClassVar[RefusalReason]
    REFUSAL_REASON_QUEUE_FULL: _ClassVar[RefusalReason]
    REFUSAL_REASON_DEADLINE: _ClassVar[RefusalReason]
    REFUSAL_REASON_EVICTED: _ClassVar[RefusalReason]
    REFUSAL_REASON_TIMED_OUT: _ClassVar[RefusalReason]
    REFUSAL_REASON_UNKNOWN_POOL: _ClassVar[RefusalReason]
PRIORITY_CLASS_UNSPECIFIED: PriorityClass
PRIORITY_CLASS_STANDARD: PriorityClass
PRIORITY_CLASS_PREMIUM: PriorityClass
PRIORITY_CLASS_VIP: PriorityClass
REFUSAL_REASON_UNSPECIFIED: RefusalReason
REFUSAL_REASON_QUEUE_FULL: RefusalReason
REFUSAL_REASON_DEADLINE: RefusalReason
REFUSAL_REASON_EVICTED: RefusalReason
REFUSAL_REASON_TIMED_OUT: RefusalReason
REFUSAL_REASON_UNKNOWN_POOL: RefusalReason

class AcquireRequest(_message.Message):
    __slots__ = ("pool", "request_id", "priority", "urgent", "estimated_tokens", "prompt_tokens", "deadline_ms", "tenant", "answer_by_ms")
    POOL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    URGENT_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ANSWER_BY_MS_FIELD_NUMBER: _ClassVar[int]
    pool: str
    request_id: str
    priority: PriorityClass
    urgent: bool
    estimated_tokens: int
    prompt_tokens: int
    deadline_ms: int
    tenant: str
    answer_by_ms: int
    def __init__(self, pool: _Optional[str] = ..., request_id: _Optional[str] = ..., priority: _Optional[_Union[PriorityClass, str]] = ..., urgent: _Optional[bool] = ..., estimated_tokens: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., deadline_ms: _Optional[int] = ..., tenant: _Optional[str] = ..., answer_by_ms: _Optional[int] = ...) -> None: ...

class Grant(_message.Message):
    __slots__ = ("grant_id", "queue_ms", "granted_class", "demoted", "lease_ms")
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    GRANTED_CLASS_FIELD_NUMBER: _ClassVar[int]
    DEMOTED_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    grant_id: str
    queue_ms: int
    granted_class: PriorityClass
    demoted: bool
    lease_ms: int
    def __init__(self, grant_id: _Optional[str] = ..., queue_ms: _Optional[int] = ..., granted_class: _Optional[_Union[PriorityClass, str]] = ..., demoted: _Optional[bool] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("reason", "eta_ms", "message")
    REASON_FIELD_NUMBER: _ClassVar[int]
    ETA_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    reason: RefusalReason
    eta_ms: int
    message: str
    def __init__(self, reason: _Optional[_Union[RefusalReason, str]] = ..., eta_ms: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("granted", "refused")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    granted: Grant
    refused: Refusal
    def __init__(self, granted: _Optional[_Union[Grant, _Mapping]] = ..., refused: _Optional[_Union[Refusal, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("grant_id", "tokens_used", "latency_ms", "ok")
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_USED_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    grant_id: str
    tokens_used: int
    latency_ms: int
    ok: bool
    def __init__(self, grant_id: _Optional[str] = ..., tokens_used: _Optional[int] = ..., latency_ms: _Optional[int] = ..., ok: _Optional[bool] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("grant_ids",)
    GRANT_IDS_FIELD_NUMBER: _ClassVar[int]
    grant_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, grant_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("unknown",)
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    unknown: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, unknown: _Optional[_Iterable[str]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClassStatus(_message.Message):
    __slots__ = ("priority", "queued", "oldest_wait_ms")
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    OLDEST_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    priority: PriorityClass
    queued: int
    oldest_wait_ms: int
    def __init__(self, priority: _Optional[_Union[PriorityClass, str]] = ..., queued: _Optional[int] = ..., oldest_wait_ms: _Optional[int] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("pool", "limit", "in_flight", "queued", "queued_tokens", "classes", "capacity_source", "reading_age_ms", "memory_pressure", "drain_per_s", "capacity_factor")
    POOL_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    QUEUED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    READING_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PRESSURE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_PER_S_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FACTOR_FIELD_NUMBER: _ClassVar[int]
    pool: str
    limit: int
    in_flight: int
    queued: int
    queued_tokens: int
    classes: _containers.RepeatedCompositeFieldContainer[ClassStatus]
    capacity_source: str
    reading_age_ms: int
    memory_pressure: bool
    drain_per_s: float
    capacity_factor: float
    def __init__(self, pool: _Optional[str] = ..., limit: _Optional[int] = ..., in_flight: _Optional[int] = ..., queued: _Optional[int] = ..., queued_tokens: _Optional[int] = ..., classes: _Optional[_Iterable[_Union[ClassStatus, _Mapping]]] = ..., capacity_source: _Optional[str] = ..., reading_age_ms: _Optional[int] = ..., memory_pressure: _Optional[bool] = ..., drain_per_s: _Optional[float] = ..., capacity_factor: _Optional[float] = ...) -> None: ...
