"""Writes should_miss.tsv and should_hit.tsv next to this file (``python tests/dedup/data/make_pairs.py``).

Provenance: every pair is built here, deterministically, from the curated templates and word
lists below (written for this project; no external data). Columns: ``lang kind a b``.

- should_miss: two prompts that ask different questions and must never share an answer:
  negation, antonyms (opposite actions), from/to swaps, numbers, dates, amounts, ids, entities,
  product names, different actions on one object.
- should_hit: two spellings of one question that the dedup layer should serve from one answer:
  punctuation, full/half width, politeness, contractions, auxiliaries and modals, synonyms,
  word order.
"""

from __future__ import annotations

import itertools
from pathlib import Path

HERE = Path(__file__).parent

Row = tuple[str, str, str, str]

# ------------------------------------------------------------------------------ should miss

EN_NEG = [
    ("Is the store open on Sunday?", "Is the store not open on Sunday?"),
    ("Can I cancel my subscription online?", "Why can't I cancel my subscription online?"),
    ("Does the plan cover dental care?", "Does the plan not cover dental care?"),
    ("Should I restart the server after the update?", "Should I never restart the server after the update?"),
    ("Is my package delivered?", "Is my package not delivered?"),
    ("Why does my card work abroad?", "Why doesn't my card work abroad?"),
    ("Can I use the app offline?", "Can't I use the app offline?"),
    ("Is the refund processed?", "Is the refund not processed?"),
    ("Do I have to pay a fee to transfer money?", "Do I not have to pay a fee to transfer money?"),
    ("Why is my account verified?", "Why isn't my account verified?"),
    ("Will the update delete my files?", "Will the update not delete my files?"),
    ("Does the hotel allow pets?", "Does the hotel not allow pets?"),
    ("How do I log in with my email?", "How do I log in without my email?"),
    ("Why did the payment go through?", "Why didn't the payment go through?"),
    ("Is it safe to share my screen?", "Is it never safe to share my screen?"),
    ("Can I pay with a credit card?", "I cannot pay with a credit card, why?"),
    ("Is the museum free on Mondays?", "Is the museum not free on Mondays?"),
    ("Does this laptop have a webcam?", "Does this laptop have no webcam?"),
    ("Why was my order shipped?", "Why wasn't my order shipped?"),
    ("Do I need a visa for Japan?", "Don't I need a visa for Japan?"),
]
ZH_NEG = [
    ("花呗可以提前还款吗", "花呗不可以提前还款吗"),
    ("我的借呗能用", "我的借呗不能用"),
    ("这个订单已经发货了吗", "这个订单还没有发货吗"),
    ("余额宝有收益", "余额宝没有收益"),
    ("为什么我的花呗能用", "为什么我的花呗不能用"),
    ("信用卡可以还花呗吗", "信用卡不可以还花呗吗"),
    ("退款已经到账了", "退款还没到账"),
    ("为什么我能开通借呗", "为什么我无法开通借呗"),
    ("花呗账单已经出了", "花呗账单还没出"),
    ("我的实名认证通过了", "我的实名认证没通过"),
    ("这个商家支持花呗付款", "这个商家不支持花呗付款"),
    ("为什么收到了验证码", "为什么收不到验证码"),
    ("花呗逾期会影响征信吗", "花呗逾期不会影响征信吗"),
    ("余额宝转出有手续费", "余额宝转出没有手续费"),
    ("我的额度恢复了", "我的额度没有恢复"),
    ("红包可以抵扣花呗吗", "红包不可以抵扣花呗吗"),
    ("借呗按时还款了", "借呗没有按时还款"),
    ("为什么能提额", "为什么不能提额"),
    ("这笔交易成功了吗", "这笔交易未成功吗"),
    ("支付宝可以绑定两张卡", "支付宝不可以绑定两张卡"),
]

EN_ANTONYM_TEMPLATES = ["How do I {} {}?", "Can I {} {} from my phone?", "Why can I {} {} only once a day?"]
EN_ANTONYM_PAIRS = [
    ("enable", "disable", "two-factor authentication"),
    ("open", "close", "a savings account"),
    ("lock", "unlock", "my SIM card"),
    ("install", "uninstall", "the desktop app"),
    ("upload", "download", "my photos"),
    ("import", "export", "my contacts"),
    ("increase", "decrease", "my credit limit"),
    ("deposit", "withdraw", "cash at the branch"),
    ("subscribe", "unsubscribe", "the newsletter"),
    ("encrypt", "decrypt", "a zip file"),
    ("buy", "sell", "shares in the app"),
    ("add", "remove", "a payment method"),
    ("block", "unblock", "a phone number"),
    ("connect", "disconnect", "my bank account"),
    ("freeze", "unfreeze", "my debit card"),
]
ZH_ANTONYM_TEMPLATES = ["怎么{}{}", "{}{}需要多久", "为什么{}{}失败"]
ZH_ANTONYM_PAIRS = [
    ("开通", "关闭", "花呗"),
    ("开启", "关闭", "指纹支付"),
    ("绑定", "解绑", "银行卡"),
    ("冻结", "解冻", "账户"),
    ("转入", "转出", "余额宝"),
    ("提高", "降低", "花呗额度"),
    ("上调", "下调", "借呗额度"),
    ("充值", "提现", "零钱"),
    ("升级", "降级", "会员"),
    ("登录", "退出", "支付宝"),
]

EN_DIRECTION = [
    ("savings", "checking"),
    ("PayPal", "my bank"),
    ("USD", "EUR"),
    ("Android", "iPhone"),
    ("Word", "PDF"),
    ("London", "Paris"),
    ("my card", "my wallet"),
    ("Celsius", "Fahrenheit"),
]
EN_DIRECTION_T = ["How do I move money from {} to {}?", "How long does a transfer from {} to {} take?"]
ZH_DIRECTION = [
    ("余额宝", "银行卡"),
    ("花呗", "借呗"),
    ("支付宝", "微信"),
    ("银行卡", "余额"),
    ("北京", "上海"),
    ("零钱", "余额宝"),
]
ZH_DIRECTION_T = ["怎么从{}转到{}", "从{}转到{}要多久"]

EN_NUMBER = [
    ("Book a table for {} people tonight", ("2", "4")),
    ("Book a table for {} people tonight", ("two", "four")),
    ("What is {} percent of 200?", ("15", "20")),
    ("Transfer {} dollars to my savings", ("500", "5000")),
    ("Is a {} hour layover enough in Frankfurt?", ("2", "3")),
    ("What changed in Python {}?", ("3.10", "3.1")),
    ("How many calories are in {} eggs?", ("3", "6")),
    ("Can I return an item after {} days?", ("30", "60")),
    ("What is the interest on a {} month loan?", ("12", "24")),
    ("Convert {} miles to kilometers", ("5", "50")),
    ("Is {} a prime number?", ("91", "97")),
    ("What is the square root of {}?", ("144", "169")),
    ("Is a {} GB plan enough for streaming?", ("5", "50")),
    ("Set an alarm for {} am", ("6", "7")),
    ("How much is a {} night stay?", ("3", "4")),
    ("Split the bill between {} friends", ("three", "five")),
    ("What is {} times 12?", ("7", "8")),
    ("Give me {} ideas for a birthday party", ("5", "10")),
]
ZH_NUMBER = [
    ("花呗分{}期手续费多少", ("12", "6")),
    ("我想借{}块", ("三千", "五千")),
    ("转账{}元到银行卡", ("500", "50")),
    ("借呗{}个月利息多少", ("3", "6")),
    ("逾期{}天会怎么样", ("3", "30")),
    ("{}号之前还款可以吗", ("9", "10")),
    ("花呗额度{}元能提额吗", ("500", "1000")),
    ("每月还{}元可以吗", ("200", "300")),
    ("花呗{}期免息吗", ("3", "12")),
    ("提前{}天还款有优惠吗", ("5", "10")),
    ("{}岁可以开通花呗吗", ("16", "18")),
    ("余额宝存{}万收益多少", ("1", "10")),
    ("一天最多转账{}次吗", ("5", "20")),
]

EN_DATE = [
    ("Is there a meeting on {}?", ("Monday", "Tuesday")),
    ("What is the weather {} in Berlin?", ("today", "tomorrow")),
    ("Show me my bank statement for {}", ("January", "February")),
    ("Are the banks open {}?", ("this weekend", "next weekend")),
    ("Where can I watch the game {}?", ("tonight", "tomorrow")),
    ("What did I spend {}?", ("last month", "this month")),
    ("Is the office open on {}?", ("Saturday", "Sunday")),
    ("Remind me to call mom {}", ("tomorrow morning", "tomorrow evening")),
    ("Book a flight to Rome in {}", ("March", "April")),
]
ZH_DATE = [
    ("{}北京天气怎么样", ("明天", "后天")),
    ("{}的账单怎么查", ("上个月", "这个月")),
    ("{}还款可以吗", ("今天", "明天")),
    ("{}能到账吗", ("周一", "周二")),
    ("{}的花呗什么时候出账", ("本月", "下个月")),
    ("{}可以提现吗", ("周六", "周日")),
    ("{}的订单能退款吗", ("昨天", "前天")),
    ("{}上午能到账吗", ("明天", "后天")),
]

EN_AMOUNT = [
    ("What is the price in {}?", ("USD", "EUR")),
    ("It costs 30 {}, is that fair?", ("dollars", "euros")),
    ("Can I pay in {} at the airport?", ("yen", "pounds")),
]
ZH_AMOUNT = [
    ("收费30{}吗", ("元", "美元")),
    ("能用{}支付吗", ("人民币", "港币")),
    ("汇率是多少{}", ("美元", "欧元")),
]

EN_ID = [
    ("Where is order {}?", ("A12345", "A12346")),
    ("Track package {}", ("1Z999AA10123456784", "1Z999AA10123456785")),
    ("What is the status of ticket #{}?", ("88120", "88121")),
    ("Reset the password for user {}", ("alice_01", "bob_02")),
    ("Show invoice {}", ("INV-2024-0042", "INV-2024-0043")),
]
ZH_ID = [
    ("查询订单号{}的物流", ("2024031512345", "2024031512354")),
    ("交易号{}的退款到哪了", ("88812345", "88812346")),
    ("工单{}处理了吗", ("A1024", "A1025")),
]

EN_ENTITY = [
    ("What is the capital of {}?", ["France", "Germany", "Spain", "Italy"]),
    ("How do I install {} on Windows?", ["numpy", "pandas", "docker", "node"]),
    ("Write a short poem about {}", ["cats", "dogs", "rain", "winter"]),
    ("What time does the {} store close?", ["Walmart", "Target", "Costco"]),
    ("Does the {} support wireless charging?", ["iPhone 12", "Galaxy S21", "Pixel 6"]),
    ("How do I cancel my {} subscription?", ["Netflix", "Spotify", "Hulu"]),
    ("Translate 'good morning' into {}", ["French", "German", "Japanese"]),
    ("Who is the CEO of {}?", ["Microsoft", "Apple", "Amazon"]),
    ("How far is {} from the airport?", ["Central Station", "the Old Town", "the harbour"]),
    ("Summarize the plot of {}", ["Hamlet", "Macbeth", "Othello", "King Lear"]),
    ("How do I connect my {} to the TV?", ["laptop", "phone", "tablet", "console"]),
    ("What are the side effects of {}?", ["ibuprofen", "aspirin", "paracetamol"]),
]
ZH_ENTITY = [
    ("{}怎么还款", ["借呗", "花呗", "网商贷"]),
    ("{}的天气怎么样", ["北京", "上海", "广州"]),
    ("{}能用花呗吗", ["iPhone", "华为手机", "小米手机"]),
    ("{}收益怎么算", ["余额宝", "零钱通", "基金"]),
    ("怎么在{}上交电费", ["支付宝", "微信", "淘宝"]),
    ("{}的利息高吗", ["借呗", "花呗", "信用卡", "网商贷"]),
    ("{}怎么退货", ["天猫", "淘宝", "京东"]),
    ("{}可以用信用卡吗", ["淘宝", "京东", "美团"]),
]

EN_ACTIONS = [
    ("How do I {} my account?", ["delete", "create", "verify", "rename"]),
    ("How do I {} a file in Google Drive?", ["share", "rename", "restore", "move"]),
    ("Can I {} my order after paying?", ["cancel", "change", "track"]),
    ("How do I {} my password?", ["change", "find"]),
]
ZH_ACTIONS = [
    ("怎么{}银行卡", ["修改", "删除", "查看"]),
    ("如何{}订单", ["取消", "查询", "评价"]),
    ("花呗账单怎么{}", ["分期", "查询", "还款"]),
]


def should_miss() -> list[Row]:
    rows: list[Row] = []
    rows += [("en", "negation", a, b) for a, b in EN_NEG]
    rows += [("zh", "negation", a, b) for a, b in ZH_NEG]
    for t, (x, y, obj) in itertools.product(EN_ANTONYM_TEMPLATES, EN_ANTONYM_PAIRS):
        rows.append(("en", "antonym", t.format(x, obj), t.format(y, obj)))
    for t, (x, y, obj) in itertools.product(ZH_ANTONYM_TEMPLATES, ZH_ANTONYM_PAIRS):
        rows.append(("zh", "antonym", t.format(x, obj), t.format(y, obj)))
    for t, (x, y) in itertools.product(EN_DIRECTION_T, EN_DIRECTION):
        rows.append(("en", "direction", t.format(x, y), t.format(y, x)))
    for t, (x, y) in itertools.product(ZH_DIRECTION_T, ZH_DIRECTION):
        rows.append(("zh", "direction", t.format(x, y), t.format(y, x)))
    for lang, kind, table in (
        ("en", "number", EN_NUMBER),
        ("zh", "number", ZH_NUMBER),
        ("en", "date", EN_DATE),
        ("zh", "date", ZH_DATE),
        ("en", "amount", EN_AMOUNT),
        ("zh", "amount", ZH_AMOUNT),
        ("en", "id", EN_ID),
        ("zh", "id", ZH_ID),
    ):
        rows += [(lang, kind, t.format(x), t.format(y)) for t, (x, y) in table]
    for lang, kind, ents in (
        ("en", "entity", EN_ENTITY),
        ("zh", "entity", ZH_ENTITY),
        ("en", "action", EN_ACTIONS),
        ("zh", "action", ZH_ACTIONS),
    ):
        for t, names in ents:
            rows += [(lang, kind, t.format(x), t.format(y)) for x, y in itertools.combinations(names, 2)]
    return rows


# ------------------------------------------------------------------------------ should hit

EN_QUESTIONS = [
    "how do I reset my password",
    "what is the refund policy",
    "how do I change my shipping address",
    "where is my order",
    "how do I contact customer support",
    "how do I delete my account",
    "what payment methods do you accept",
    "how long does delivery take",
    "how do I cancel my subscription",
    "how do I update my billing information",
    "is there a student discount",
    "how do I track my package",
    "what is your return window",
    "how do I turn on dark mode",
    "how do I export my contacts",
    "why was my card declined",
    "how do I enable two-factor authentication",
    "what are your opening hours",
    "how do I add a user to my team",
    "how do I download my invoices",
]
ZH_QUESTIONS = [
    "花呗怎么还款",
    "借呗怎么提前还款",
    "余额宝怎么转出",
    "花呗额度怎么提升",
    "怎么修改支付密码",
    "怎么绑定银行卡",
    "花呗账单怎么查",
    "怎么开通花呗",
    "退款多久到账",
    "花呗逾期有什么影响",
    "怎么注销支付宝账户",
    "借呗利息怎么算",
    "怎么关闭自动续费",
    "花呗分期怎么操作",
    "怎么更换绑定的手机号",
    "余额宝收益怎么算",
    "花呗怎么设置还款日",
    "怎么申请退款",
    "实名认证怎么做",
    "怎么查看交易记录",
]
EN_POLITE = ["Hi, {}?", "Hello, {}?", "Please, {}?", "{}, please?", "{}? Thanks!", "Hey there, {}?"]
ZH_POLITE = ["请问{}", "你好，{}？", "您好，{}？", "{}？谢谢", "请问一下，{}？", "{}，谢谢"]
EN_PUNCT = ["{}?", "{}??", "{}", "  {}  ?", "{}？", "{}!", "{}."]
ZH_PUNCT = ["{}？", "{}?", "{}。", "{}！", "{}？？", "{} ？"]
EN_WIDTH = ["ＨＯＷ ＤＯ Ｉ ＲＥＳＥＴ ＭＹ ＰＡＳＳＷＯＲＤ？"]

EN_VARIANTS = [  # (a, b, kind)
    ("What is the refund policy?", "What's the refund policy?", "contraction"),
    ("Where is my order?", "Where's my order?", "contraction"),
    ("Why can't I log in?", "Why cannot I log in?", "contraction"),
    ("I do not remember my password, what now?", "I don't remember my password, what now?", "contraction"),
    ("It is not charging, what should I do?", "It isn't charging, what should I do?", "contraction"),
    ("What is the weather in Paris?", "What's the weather in Paris?", "contraction"),
    ("Let us know how to reset the router", "Let's know how to reset the router", "contraction"),
    ("Who is the account owner?", "Who's the account owner?", "contraction"),
    ("How is the battery life?", "How's the battery life?", "contraction"),
    ("What is a good name for a cat?", "What's a good name for a cat?", "contraction"),
    ("How do I reset my password?", "How can I reset my password?", "modal"),
    ("How do I change my shipping address?", "How can I change my shipping address?", "modal"),
    ("How do I cancel my subscription?", "How should I cancel my subscription?", "modal"),
    ("How do I contact customer support?", "How can I contact customer support?", "modal"),
    ("How do I track my package?", "How could I track my package?", "modal"),
    ("How do I export my contacts?", "How can I export my contacts?", "modal"),
    ("How do I download my invoices?", "How can I download my invoices?", "modal"),
    ("How do I delete my account?", "How would I delete my account?", "modal"),
    ("How do I turn on dark mode?", "How can I turn on dark mode?", "modal"),
    ("How do I add a user to my team?", "How can I add a user to my team?", "modal"),
    ("How do I update my billing information?", "How can I update my billing information?", "modal"),
    ("How do I enable two-factor authentication?", "How can I enable two-factor authentication?", "modal"),
    ("Where do I buy a gift card?", "Where can I purchase a gift card?", "synonym"),
    ("How do I fix a broken screen?", "How do I repair a broken screen?", "synonym"),
    ("How do I change my email address?", "How do I update my email address?", "synonym"),
    ("How do I delete a photo?", "How do I remove a photo?", "synonym"),
    ("What is the cost of shipping?", "What is the price of shipping?", "synonym"),
    ("When does the store open?", "When does the shop open?", "synonym"),
    ("How do I start a free trial?", "How do I begin a free trial?", "synonym"),
    ("Can you help me reset my password?", "Can you assist me to reset my password?", "synonym"),
    ("How do I change my profile picture?", "How do I change my profile photo?", "synonym"),
    ("How do I modify my order?", "How do I change my order?", "synonym"),
    ("How do I get a refund?", "How do I receive a refund?", "synonym"),
    (
        "What is the fastest way to reach the airport?",
        "What is the quickest way to reach the airport?",
        "synonym",
    ),
    ("How do I fix this error?", "How do I fix this issue?", "synonym"),
    ("Tomorrow, what is the weather in Berlin?", "What is the weather in Berlin tomorrow?", "order"),
    ("For my account, how do I reset the password?", "How do I reset the password for my account?", "order"),
    ("In the app, where are the settings?", "Where are the settings in the app?", "order"),
    ("On Sundays, is the store open?", "Is the store open on Sundays?", "order"),
    ("With a credit card, can I pay?", "Can I pay with a credit card?", "order"),
]
ZH_VARIANTS = [
    ("花呗怎么还款", "花呗如何还款", "synonym"),
    ("怎么修改手机号", "怎么更改手机号", "synonym"),
    ("退款要多久到账", "退款需要多长时间到账", "synonym"),
    ("为什么花呗用不了", "为啥花呗用不了", "synonym"),
    ("怎样开通花呗", "怎么开通花呗", "synonym"),
    ("如何查询账单", "怎么查看账单", "synonym"),
    ("借呗怎么还钱", "借呗如何还款", "synonym"),
    ("怎么更换银行卡", "如何修改银行卡", "synonym"),
    ("花呗开通要多久", "花呗开通需要多长时间", "synonym"),
    ("为什么支付失败", "为何支付失败", "synonym"),
    ("花呗可以分期吗", "花呗能分期吗", "modal"),
    ("借呗可以提前还款吗", "借呗能提前还款吗", "modal"),
    ("余额宝能转出吗", "余额宝可以转出吗", "modal"),
    ("信用卡能还花呗吗", "信用卡可以还花呗吗", "modal"),
    ("支付宝能绑定两张卡吗", "支付宝可以绑定两张卡吗", "modal"),
    ("花呗怎么还款啊", "花呗怎么还款呢", "particle"),
    ("借呗额度怎么提升呢", "借呗额度怎么提升", "particle"),
    ("花呗账单怎么查呀", "花呗账单怎么查", "particle"),
    ("我的花呗怎么还款", "花呗怎么还款", "particle"),
    ("请问我的借呗怎么提前还款", "借呗怎么提前还款", "particle"),
]


def should_hit() -> list[Row]:
    rows: list[Row] = []
    for q in EN_QUESTIONS:
        rows += [("en", "punctuation", q.capitalize() + "?", t.format(q)) for t in EN_PUNCT]
        rows += [("en", "politeness", q.capitalize() + "?", t.format(q)) for t in EN_POLITE]
    for q in ZH_QUESTIONS:
        rows += [("zh", "punctuation", q, t.format(q)) for t in ZH_PUNCT]
        rows += [("zh", "politeness", q, t.format(q)) for t in ZH_POLITE]
        full = "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in q + "?")
        rows.append(("zh", "width", q + "?", full))
    rows.append(("en", "width", "How do I reset my password?", EN_WIDTH[0]))
    rows += [("en", kind, a, b) for a, b, kind in EN_VARIANTS]
    rows += [("zh", kind, a, b) for a, b, kind in ZH_VARIANTS]
    return rows


def write(path: Path, rows: list[Row]) -> None:
    path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")


def read(path: Path) -> list[Row]:
    return [tuple(line.split("\t")) for line in path.read_text(encoding="utf-8").splitlines()]  # type: ignore[misc]


if __name__ == "__main__":
    write(HERE / "should_miss.tsv", should_miss())
    write(HERE / "should_hit.tsv", should_hit())
    print(len(should_miss()), "should-miss,", len(should_hit()), "should-hit")
