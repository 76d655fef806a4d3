"""The seed's traffic mix as pure functions: prompt families, tiers, sizes, invalid bodies.

A family is one question asked several ways (its variants are paraphrases). Families come
from the paraphrase pairs under `/work/shared/data/paraphrase` (read in place at run time,
score ≥ 4 of 5 = the same question) when that folder exists, plus generated templates in
English and Chinese. `Mix.draw(rng)` picks a family by a Zipf law (rank k has weight
1/k^s) and then an exact repeat, a near-exact variant (case, spacing, punctuation) or a
paraphrase; 70% short, 20% medium (a context of ~400–2,500 words), 10% long (~4,500–8,000
words), and `invalid_share` of bodies broken in one of several ways.
"""

from __future__ import annotations

import hashlib
import os
import random
from bisect import bisect
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

import orjson

PARAPHRASE_DIR = Path(os.environ.get("LLM_GATE_PARAPHRASE_DIR", "/work/shared/data/paraphrase"))
MODEL = "llama-3-8b"
URGENT = {"en": ["urgent:", "asap,", "immediately:"], "zh": ["紧急：", "马上", "立刻"]}
INVALID_KINDS = ("bad_json", "wrong_type", "bad_role", "role_object", "over_long", "no_messages",
                 "bad_temperature", "part_type_array")

# Tier -> (share, api keys). The keys are those of LOAD_CONFIG below.
TIERS: dict[str, tuple[float, list[str]]] = {
    "vip": (0.10, ["sk-load-vip"]),
    "premium": (0.20, ["sk-load-premium"]),
    "standard": (0.70, ["sk-load-std-0", "sk-load-std-1", "sk-load-std-2", "sk-load-std-3"]),
}
LIMITED_KEY = "sk-load-limited"  # a standard caller with its own 1/s, burst 5 bucket
LIMITED = {"rate": 1.0, "burst": 5}

LOAD_IDENTITY: dict[str, Any] = {
    "api_keys": {
        "sk-load-vip": {"tenant": "acme", "tier": "vip"},
        "sk-load-premium": {"tenant": "gamma", "tier": "premium"},
        **{f"sk-load-std-{i}": {"tenant": f"std-{i}", "tier": "standard"} for i in range(4)},
        LIMITED_KEY: {"tenant": "limited", "tier": "standard", "user": "u-limited"},
    }
}

_EN_TEMPLATES = [
    ("How do I {v} my {o}?", "What is the way to {v} my {o}?", "Can you tell me how to {v} my {o}?"),
    ("Why can I not {v} my {o}?", "What stops me from being able to {v} my {o}?",
     "Is there a reason I am unable to {v} my {o}?"),
    ("How long does it take to {v} my {o}?", "What is the time needed to {v} my {o}?",
     "When will it be done if I {v} my {o}?"),
]
_EN_VERBS = ["reset", "change", "cancel", "renew", "transfer", "verify", "close", "update", "refund",
             "unlock", "upgrade", "export"]
_EN_OBJECTS = ["password", "account", "order", "subscription", "invoice", "phone number", "address",
               "credit card", "profile", "delivery", "membership", "booking", "email address"]
_ZH_TEMPLATES = [
    ("怎么{v}我的{o}？", "如何{v}我的{o}？", "请问{v}{o}应该怎么操作？"),
    ("为什么我不能{v}{o}？", "我的{o}为什么{v}不了？", "{v}{o}失败是什么原因？"),
    ("{v}{o}需要多长时间？", "{v}{o}要多久？", "{v}{o}大概几天能好？"),
]
_ZH_VERBS = ["修改", "取消", "退订", "绑定", "解绑", "更换", "注销", "找回", "升级", "冻结"]
_ZH_OBJECTS = ["密码", "账户", "订单", "会员", "银行卡", "手机号", "收货地址", "发票", "花呗", "邮箱"]
_WORDS = ["the", "a", "of", "service", "report", "quarter", "revenue", "customer", "order", "support",
          "team", "policy", "update", "system", "data", "review", "region", "product", "shipment",
          "market", "contract", "issue", "process"]


@dataclass(frozen=True)
class Family:
    id: str
    lang: str
    variants: tuple[str, ...]


@dataclass(frozen=True)
class Draw:
    """One request to send: its body bytes and what the load generator records of it."""

    body: bytes
    headers: dict[str, str]
    tier: str
    family: str
    lang: str
    size: str  # short, medium, long ('-' for invalid)
    kind: str  # exact, near, paraphrase, or invalid:<how>
    stream: bool
    urgent: bool

    @property
    def invalid(self) -> bool:
        return self.kind.startswith("invalid")


def _read_pairs(path: Path, min_score: float) -> list[tuple[str, str]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[0] != parts[1]:
            try:
                score = float(parts[2])
            except ValueError:
                continue
            if score >= min_score:
                out.append((parts[0].strip(), parts[1].strip()))
    return out


def build_families(data_dir: Path = PARAPHRASE_DIR) -> list[Family]:
    """Generated template families first (rank order interleaves en and zh), then data pairs."""
    fams: list[Family] = []
    for lang, templates, verbs, objects in (("en", _EN_TEMPLATES, _EN_VERBS, _EN_OBJECTS),
                                            ("zh", _ZH_TEMPLATES, _ZH_VERBS, _ZH_OBJECTS)):
        for ti, t in enumerate(templates):
            for v in verbs:
                for o in objects:
                    fams.append(Family(f"{lang}-t{ti}-{v}-{o}".replace(" ", "_"), lang,
                                       tuple(x.format(v=v, o=o) for x in t)))
    pairs = [("en", p) for p in _read_pairs(data_dir / "stsb-en.dev.tsv", 4.0)]
    pairs += [("zh", p) for p in _read_pairs(data_dir / "stsb-zh.valid.tsv", 4.0)]
    seen = {v.casefold() for f in fams for v in f.variants}
    for i, (lang, (a, b)) in enumerate(pairs):
        if a.casefold() in seen or b.casefold() in seen:
            continue  # a sentence in two pairs would make two families ask one question
        seen |= {a.casefold(), b.casefold()}
        fams.append(Family(f"{lang}-d{i}", lang, (a, b)))
    random.Random(7).shuffle(fams)  # a stable rank order mixing both sources and languages
    return fams


def near_variant(text: str, rng: random.Random) -> str:
    """The same words, changed the way a user retypes: case, spaces, trailing punctuation."""
    how = rng.randrange(4)
    if how == 0:
        return text.lower()
    if how == 1:
        return "  " + text.replace(" ", "  ", 1)
    if how == 2:
        return text.rstrip("?.!？。！") + ("!!" if text.isascii() else "！")
    return text.upper() if text.isascii() else text + " "


def context(family: str, words: int) -> str:
    """A deterministic document for a family, so that repeats of long prompts repeat exactly."""
    seed = int.from_bytes(hashlib.sha256(family.encode()).digest()[:8], "big")
    r = random.Random(seed + words)
    return " ".join(r.choice(_WORDS) for _ in range(words))


def invalid_body(kind: str, rng: random.Random) -> bytes:
    msg: dict[str, Any] = {"role": "user", "content": "hello"}
    body: dict[str, Any] = {"model": MODEL, "messages": [msg]}
    if kind == "bad_json":
        return b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": '
    if kind == "wrong_type":
        body["messages"] = "hello"
    elif kind == "bad_role":
        msg["role"] = "wizard"
    elif kind == "role_object":
        msg["role"] = {"name": "user"} if rng.random() < 0.5 else ["user"]
    elif kind == "over_long":
        msg["content"] = "word " * 17_000
    elif kind == "no_messages":
        del body["messages"]
    elif kind == "bad_temperature":
        body["temperature"] = 9
    elif kind == "part_type_array":
        msg["content"] = [{"type": ["text"], "text": "hello"}]
    return orjson.dumps(body)


@dataclass
class Mix:
    families: list[Family] = field(default_factory=build_families)
    zipf_s: float = 1.1
    repeat_share: float = 0.6  # of valid prompts: the family's first wording, as is
    near_share: float = 0.2  # ... a near-exact variant; the rest: another paraphrase
    invalid_share: float = 0.10
    stream_share: float = 0.3
    urgent_share: float = 0.05
    limited_share: float = 0.0  # share of requests sent with LIMITED_KEY
    sizes: tuple[tuple[str, float], ...] = (("short", 0.7), ("medium", 0.2), ("long", 0.1))
    _cum: list[float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._cum = list(accumulate(1.0 / (k ** self.zipf_s) for k in range(1, len(self.families) + 1)))

    def family(self, rng: random.Random) -> Family:
        return self.families[min(bisect(self._cum, rng.random() * self._cum[-1]), len(self.families) - 1)]

    def tier(self, rng: random.Random) -> tuple[str, str]:
        if rng.random() < self.limited_share:
            return "standard", LIMITED_KEY
        x, acc = rng.random(), 0.0
        for tier, (share, keys) in TIERS.items():
            acc += share
            if x < acc:
                return tier, rng.choice(keys)
        return "standard", TIERS["standard"][1][0]

    def draw(self, rng: random.Random) -> Draw:
        tier, key = self.tier(rng)
        headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
        stream = rng.random() < self.stream_share
        if rng.random() < self.invalid_share:
            kind = rng.choice(INVALID_KINDS)
            return Draw(invalid_body(kind, rng), headers, tier, "-", "-", "-", "invalid:" + kind,
                        stream, False)
        fam = self.family(rng)
        x = rng.random()
        if x < self.repeat_share:
            kind, text = "exact", fam.variants[0]
        elif x < self.repeat_share + self.near_share:
            kind, text = "near", near_variant(fam.variants[0], rng)
        else:
            kind, text = "paraphrase", rng.choice(fam.variants[1:])
        urgent = rng.random() < self.urgent_share
        if urgent:
            text = rng.choice(URGENT[fam.lang]) + " " + text
        y, acc, size = rng.random(), 0.0, "short"
        for name, share in self.sizes:
            acc += share
            size = name
            if y < acc:
                break
        if size != "short":
            lo, hi = (400, 2500) if size == "medium" else (4500, 8000)
            words = lo + int.from_bytes(hashlib.sha256(fam.id.encode()).digest()[:4], "big") % (hi - lo)
            text = f"{context(fam.id, words)}\n\nQuestion: {text}"
        body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": text}],
                                "max_tokens": 16 + rng.randrange(4) * 16}
        if stream:
            body["stream"] = True
        headers["x-sim-family"] = fam.id
        return Draw(orjson.dumps(body), headers, tier, fam.id, fam.lang, size, kind, stream, urgent)
