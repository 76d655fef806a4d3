"""Latency circuit breaker: rolling windows per pool, a pure state machine, a shared shell."""
