"""Scheduler protobuf ⇄ the queue's plain events: the only scheduler module that imports gen/."""

from __future__ import annotations

from ..gen import scheduler_pb2 as pb
from ..gen import scheduler_pb2_grpc as pb_grpc
from .queue import Granted, Reason, Refused, Ticket

__all__ = ["pb", "pb_grpc"]

CLASS_TO_PB = {
    "vip": pb.PRIORITY_CLASS_VIP,
    "premium": pb.PRIORITY_CLASS_PREMIUM,
    "standard": pb.PRIORITY_CLASS_STANDARD,
}
PB_TO_CLASS = {v: k for k, v in CLASS_TO_PB.items()}
REASON_TO_PB: dict[str, pb.RefusalReason] = {
    "queue_full": pb.REFUSAL_REASON_QUEUE_FULL,
    "deadline": pb.REFUSAL_REASON_DEADLINE,
    "evicted": pb.REFUSAL_REASON_EVICTED,
    "timed_out": pb.REFUSAL_REASON_TIMED_OUT,
}
PB_TO_REASON: dict[pb.RefusalReason, Reason] = {
    pb.REFUSAL_REASON_QUEUE_FULL: "queue_full",
    pb.REFUSAL_REASON_DEADLINE: "deadline",
    pb.REFUSAL_REASON_EVICTED: "evicted",
    pb.REFUSAL_REASON_TIMED_OUT: "timed_out",
}


def acquire_request(pool: str, ticket: Ticket, prompt_tokens: int, tenant: str) -> pb.AcquireRequest:
    deadline_ms = 0 if ticket.deadline_s is None else max(1, round(ticket.deadline_s * 1000))
    return pb.AcquireRequest(
        pool=pool,
        request_id=ticket.id,
        priority=CLASS_TO_PB.get(ticket.cls, pb.PRIORITY_CLASS_STANDARD),
        urgent=ticket.urgent,
        estimated_tokens=ticket.tokens,
        prompt_tokens=prompt_tokens,
        deadline_ms=deadline_ms,
        tenant=tenant,
        answer_by_ms=0 if ticket.answer_by_s is None else max(1, round(ticket.answer_by_s * 1000)),
    )


def ticket_of(request: pb.AcquireRequest) -> Ticket:
    return Ticket(
        id=request.request_id,
        cls=PB_TO_CLASS.get(request.priority, "standard"),
        urgent=request.urgent,
        tokens=request.estimated_tokens,
        deadline_s=request.deadline_ms / 1000 if request.deadline_ms else None,
        answer_by_s=request.answer_by_ms / 1000 if request.answer_by_ms else None,
    )


def acquire_response(outcome: Granted | Refused, lease_s: float, message: str = "") -> pb.AcquireResponse:
    if isinstance(outcome, Granted):
        grant = pb.Grant(
            grant_id=outcome.id,
            queue_ms=round(outcome.waited_s * 1000),
            granted_class=CLASS_TO_PB[outcome.cls],
            demoted=outcome.demoted,
            lease_ms=round(lease_s * 1000),
        )
        return pb.AcquireResponse(granted=grant)
    refusal = pb.Refusal(
        reason=REASON_TO_PB.get(outcome.reason, pb.REFUSAL_REASON_UNSPECIFIED),
        eta_ms=round(outcome.eta_s * 1000),
        message=message,
    )
    return pb.AcquireResponse(refused=refusal)


def outcome_of(response: pb.AcquireResponse, ticket: Ticket) -> Granted | Refused:
    if response.WhichOneof("outcome") == "granted":
        g = response.granted
        cls = PB_TO_CLASS.get(g.granted_class, "standard")
        return Granted(g.grant_id or ticket.id, cls, ticket.cls, g.queue_ms / 1000, g.demoted)
    r = response.refused
    return Refused(ticket.id, PB_TO_REASON.get(r.reason, "queue_full"), r.eta_ms / 1000, ticket.cls)
