"""A small curated zh+en lexicon: what differs without changing the question, and what flips it.

- ``CONTRACTIONS``: English contractions and their expansion (what's -> what is, can't -> can not).
- ``SYNONYMS``: words that ask the same thing, mapped to one representative per class
  (修改/更改, 多久/多长时间, purchase/buy). Applied before tokens are compared, so a synonym
  swap is no substitution.
- ``ANTONYMS``: pairs of opposite actions or directions (开通/关闭, enable/disable): one side in
  one prompt and the other side in the other is a different question, whatever the cosine.
- Auxiliaries and modals (do/can/could/would/should/will, 能/可以/会) are function words: "how do
  I" and "how can I" ask the same.
"""

from __future__ import annotations

import re
from functools import lru_cache

CONTRACTIONS: dict[str, str] = {
    "can't": "can not",
    "cannot": "can not",
    "won't": "will not",
    "shan't": "shall not",
    "let's": "let us",
    "what's": "what is",
    "where's": "where is",
    "who's": "who is",
    "how's": "how is",
    "when's": "when is",
    "why's": "why is",
    "it's": "it is",
    "that's": "that is",
    "there's": "there is",
    "here's": "here is",
    "he's": "he is",
    "she's": "she is",
    "i'm": "i am",
}
_SUFFIXES = (("n't", " not"), ("'re", " are"), ("'ve", " have"), ("'ll", " will"), ("'d", " would"))

AUXILIARIES = frozenset(
    [
        "do",
        "does",
        "did",
        "doing",
        "done",
        "can",
        "could",
        "may",
        "might",
        "will",
        "would",
        "shall",
        "should",
        "am",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "have",
        "has",
        "had",
    ]
)

_SYNONYM_CLASSES: tuple[tuple[str, ...], ...] = (
    # Chinese (customer service and general)
    ("修改", "更改", "改变", "变更", "更换", "换"),
    ("多久", "多长时间", "多少时间", "多少天", "几天"),
    ("怎么", "如何", "怎样", "怎么样", "咋", "怎么办", "该怎么", "怎么才能", "如何才能"),
    ("为什么", "为何", "为啥", "怎么回事", "什么原因", "啥原因"),
    ("什么", "啥", "哪些"),
    ("开通", "开启", "打开", "激活"),
    ("关闭", "关掉", "停用"),
    ("还款", "还钱", "还"),
    ("借款", "借钱"),
    ("支付", "付款", "付钱"),
    ("额度", "信用额度", "可用额度"),
    ("提前还款", "提前还"),
    ("帐户", "账户", "账号", "帐号"),
    ("手机", "手机号", "电话"),
    ("查询", "查看", "查", "看"),
    ("使用", "用"),
    ("现在", "目前", "当前"),
    ("已经", "已"),
    ("了吗", "吗", "么", "呢"),
    ("一下", "下"),
    ("要", "需要", "得要", "必须"),
    ("不可以", "不能", "无法", "不能够", "用不了", "不了"),
    # English
    ("buy", "purchase"),
    ("begin", "start"),
    ("big", "large", "huge"),
    ("small", "little", "tiny"),
    ("fast", "quick", "quickly", "rapid"),
    ("fastest", "quickest"),
    ("help", "assist"),
    ("fix", "repair"),
    ("photo", "picture", "image", "pic"),
    ("kid", "child", "boy", "girl"),
    ("man", "guy", "person", "men", "people", "someone", "somebody"),
    ("woman", "lady", "women"),
    ("talk", "speak"),
    ("speaking", "talking"),
    ("car", "automobile", "vehicle"),
    ("movie", "film"),
    ("get", "obtain", "receive"),
    ("change", "modify", "update", "alter"),
    ("delete", "remove", "erase"),
    ("reset", "recover"),
    ("error", "issue", "problem"),
    ("refund", "refunds", "reimbursement"),
    ("email", "e-mail", "mail"),
    ("cost", "price", "charge", "fee"),
    ("shop", "store"),
    ("fix", "solve", "resolve"),
    ("sofa", "couch"),
    ("cut", "slice", "chop"),
    ("stove", "oven"),
    ("plane", "airplane", "aircraft", "jet"),
    ("cat", "kitten"),
    ("dog", "puppy"),
    ("tell", "show", "explain", "describe"),
    ("need", "want", "wish", "like"),
    ("ok", "okay", "fine"),
)

# the representative of each word's class (the first word); a word in two classes keeps the first
SYNONYMS: dict[str, str] = {}
for _cls in _SYNONYM_CLASSES:
    for _w in _cls:
        SYNONYMS.setdefault(_w, _cls[0])

ANTONYMS: tuple[tuple[str, str], ...] = (
    ("开通", "关闭"),
    ("开启", "关闭"),
    ("打开", "关闭"),
    ("激活", "冻结"),
    ("冻结", "解冻"),
    ("绑定", "解绑"),
    ("增加", "减少"),
    ("提高", "降低"),
    ("上调", "下调"),
    ("升级", "降级"),
    ("转入", "转出"),
    ("存入", "取出"),
    ("充值", "提现"),
    ("借款", "还款"),
    ("借钱", "还钱"),
    ("收款", "付款"),
    ("买入", "卖出"),
    ("购买", "出售"),
    ("最高", "最低"),
    ("最多", "最少"),
    ("最早", "最晚"),
    ("以前", "以后"),
    ("之前", "之后"),
    ("上传", "下载"),
    ("登录", "退出"),
    ("加入", "退出"),
    ("允许", "禁止"),
    ("成功", "失败"),
    ("包括", "不包括"),
    ("enable", "disable"),
    ("enabled", "disabled"),
    ("open", "close"),
    ("opened", "closed"),
    ("turn on", "turn off"),
    ("switch on", "switch off"),
    ("log in", "log out"),
    ("login", "logout"),
    ("sign in", "sign out"),
    ("subscribe", "unsubscribe"),
    ("lock", "unlock"),
    ("install", "uninstall"),
    ("encrypt", "decrypt"),
    ("compress", "decompress"),
    ("upload", "download"),
    ("import", "export"),
    ("increase", "decrease"),
    ("increase", "reduce"),
    ("raise", "lower"),
    ("buy", "sell"),
    ("purchase", "sell"),
    ("deposit", "withdraw"),
    ("borrow", "lend"),
    ("borrow", "repay"),
    ("send", "receive"),
    ("add", "remove"),
    ("add", "delete"),
    ("include", "exclude"),
    ("accept", "reject"),
    ("allow", "block"),
    ("allow", "deny"),
    ("start", "stop"),
    ("begin", "end"),
    ("win", "lose"),
    ("before", "after"),
    ("above", "below"),
    ("more", "less"),
    ("more", "fewer"),
    ("most", "least"),
    ("maximum", "minimum"),
    ("max", "min"),
    ("highest", "lowest"),
    ("largest", "smallest"),
    ("biggest", "smallest"),
    ("fastest", "slowest"),
    ("cheapest", "most expensive"),
    ("best", "worst"),
    ("early", "late"),
    ("earlier", "later"),
    ("first", "last"),
    ("push", "pull"),
    ("encode", "decode"),
    ("connect", "disconnect"),
    ("mount", "unmount"),
    ("freeze", "unfreeze"),
    ("block", "unblock"),
    ("hide", "show"),
    ("visible", "hidden"),
    ("public", "private"),
    ("true", "false"),
    ("valid", "invalid"),
    ("legal", "illegal"),
    ("possible", "impossible"),
    ("safe", "dangerous"),
    ("hot", "cold"),
    ("good", "bad"),
    ("pros", "cons"),
    ("advantages", "disadvantages"),
    ("benefits", "risks"),
    ("import", "export"),
    ("ascending", "descending"),
    ("north", "south"),
    ("east", "west"),
    ("left", "right"),
    ("plus", "minus"),
    ("male", "female"),
    ("husband", "wife"),
    ("buyer", "seller"),
    ("client", "server"),
)

_EN_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def expand_contractions(text: str) -> str:
    """Lower-case English text with contractions spelt out (what's -> what is, isn't -> is not)."""

    def one(m: re.Match[str]) -> str:
        w = m.group()
        if w in CONTRACTIONS:
            return CONTRACTIONS[w]
        for suffix, full in _SUFFIXES:
            if w.endswith(suffix) and len(w) > len(suffix):
                return w[: -len(suffix)] + full
        return w

    return _EN_WORD.sub(one, text)


_ZH_SYNONYMS = sorted((w for w in SYNONYMS if not w.isascii()), key=len, reverse=True)
_ZH_SYN = re.compile("|".join(map(re.escape, _ZH_SYNONYMS)))


def zh_synonyms(text: str) -> str:
    """Chinese synonyms replaced by their class representative, longest match first."""
    return _ZH_SYN.sub(lambda m: SYNONYMS[m.group()], text)


# Each opposite, as it is looked for: an English word or phrase whole, between word boundaries
# (each run of word characters in it is then a whole word of the text: the words a text holds
# find the few phrases worth a search), a Chinese one as a substring.
_WORDS = re.compile(r"\w+")
_TERMS = tuple(dict.fromkeys(w for pair in ANTONYMS for w in pair))


def _by_first_word() -> dict[str, list[tuple[str, tuple[str, ...], re.Pattern[str]]]]:
    """English opposites by their first word: (the term, its other words, its pattern)."""
    index: dict[str, list[tuple[str, tuple[str, ...], re.Pattern[str]]]] = {}
    for term in (w for w in _TERMS if w.isascii()):
        first, *rest = _WORDS.findall(term)
        index.setdefault(first, []).append((term, tuple(rest), re.compile(rf"\b{re.escape(term)}\b")))
    return index


_EN_BY_FIRST_WORD = _by_first_word()
_ZH_TERMS = tuple(w for w in _TERMS if not w.isascii())


@lru_cache(maxsize=4096)
def _opposites_in(text: str) -> frozenset[str]:
    """The opposites `text` holds. A text meets many others (a query its candidates, a stored
    prompt every query near it): each is read once, not once per pair and per opposite."""
    words = set(_WORDS.findall(text))
    found = {
        term
        for word in words
        for term, rest, pattern in _EN_BY_FIRST_WORD.get(word, ())
        if all(r in words for r in rest) and pattern.search(text)
    }
    if not text.isascii():
        found.update(w for w in _ZH_TERMS if w in text)
    return frozenset(found)


def antonym_flip(a: str, b: str) -> tuple[str, str] | None:
    """An opposite pair with one side only in ``a`` and the other only in ``b`` (texts canonical)."""
    in_a, in_b = _opposites_in(a), _opposites_in(b)
    if not in_a or not in_b:
        return None
    for x, y in ANTONYMS:
        for p, q in ((x, y), (y, x)):
            if p in in_a and p not in in_b and q in in_b and q not in in_a:
                return (p, q)
    return None
