"""The words that tell what a chat-ops question asks, in English and Chinese.

Rules, not a model: the 135M model cannot be trusted to tell "p99" from "p95". Each cue is a
regular expression over the question; English cues match whole words, Chinese ones (no spaces
between words) match anywhere. Numbers in a window may be digits or Chinese numerals
("过去十分钟", "最近两小时", "近半小时").
"""

from __future__ import annotations

import re

__all__ = ["BY_REPLICA", "BY_VERSION", "CAUSE", "FAILED", "NEW", "TELEMETRY", "VERSION",
           "percentiles", "window_minutes", "zh_action"]


# Word edges that treat Chinese characters as non-word: "的P99延迟" has p99 as a word (Python's
# \b sees CJK characters as word characters).
_L, _R = r"(?<![a-z0-9_])", r"(?![a-z0-9_])"


def _cue(english: str, chinese: str = "") -> re.Pattern[str]:
    parts = [rf"{_L}(?:{english}){_R}"] + ([f"(?:{chinese})"] if chinese else [])
    return re.compile("|".join(parts), re.I)


# Asking why or what happened: an investigation, even when it names a metric ("why did p99
# jump?"), not a figure. "Broken down by replica" asks for a breakdown, not a cause.
CAUSE = _cue(r"why|happen\w*|wrong|root cause|explain\w*|broke\w*(?!\s+down)|caus\w+|going on|"
             r"problems?|issues?|failing",
             r"为什么|为何|为啥|怎么了|怎么回事|咋回事|咋了|发生了什么|原因|出了什么问题|出什么问题|"
             r"故障")

# A multiple of today's load: "2x", "1.5 times", "double", "50% more"; "两倍", "翻倍".
_MULTIPLE = (r"(?:\d+(?:\.\d+)?\s*(?:x|\u00d7|times)|double|twice|triple|thrice|quadruple|"
             r"half again|\d+(?:\.\d+)?\s*%\s*more)")
_ZH_MULTIPLE = r"(?:\d+(?:\.\d+)?|[一二两三四五六七八九十]+)\s*倍|翻倍|翻一番|双倍"

# Telemetry questions, most specific first: the first that matches decides.
TELEMETRY: list[tuple[str, re.Pattern[str]]] = [
    ("compare", _cue(r"compare\w*|versus|vs\.?|difference between|differ",
                     r"对比|比较|相比|区别|差异")),
    ("slo", _cue(r"slos?|error budgets?|budgets?|objectives?|burn rate",
                 r"错误预算|预算|服务等级|服务水平")),
    # A load asked about ("can chat take 2x the traffic?", "how many replicas for triple the
    # load?"): whether the replicas would serve it, not how full they are now.
    ("capacity", _cue(
        rf"{_MULTIPLE}\s+(?:(?:the|our|its|today'?s|current|as much|more)\s+)*"
        r"(?:traffic|load|requests?|qps|rps|users?|volume)|"
        r"(?:traffic|load|requests?|qps|volume)\s+(?:\w+\s+)?(?:doubles?|doubled|triples?|"
        r"tripled|grows?|spikes?|surges?|increases?)|"
        r"how many replicas.{0,40}(?:need\w*|required|for|to (?:handle|serve|take))|"
        r"capacity plan\w*|(?:can|could|will|would).{0,30}(?:handle|take|absorb|cope with|"
        r"survive|sustain|withstand).{0,30}(?:traffic|load|spike|surge|peak)",
        rf"{_ZH_MULTIPLE}|扛得?住|扛不住|撑得?住|撑不住|顶得?住|承受得?住|能承受|承载|容量规划|"
        r"(?:需要|要)(?:多少|几)个?副本")),
    # Traffic shares ("which version is taking traffic and what share does each get?") are
    # request rates per version, each as a share of the model's.
    ("throughput", _cue(r"tokens?|throughput|tokens?/s|tok/s|qps|rps|req/s|request rate|"
                        r"requests? (?:per|a|/) ?(?:second|sec|s)|taking traffic|"
                        r"(?:what|which) share|share of (?:the )?(?:traffic|requests)|"
                        r"traffic (?:share|split)",
                        r"吞吐|令牌|词元|每秒请求|请求量|请求速率|请求率|流量占比|流量分配|"
                        r"占多少流量|流量比例")),
    ("traces", _cue(r"traces?|(?:slowest|longest|failed|failing|erroring|errored) "
                    r"(?:requests?|calls?)|spans?|(?:requests?|calls?)(?: \S+){0,5} failed",
                    r"链路|追踪|调用链|耗时最长|(?:最慢|最长|最久|失败|报错|出错|slowest|failed)"
                    r"\s*的?(?:那些|这些|几个)?请求|(?:请求|调用)\S{0,3}(?:最慢|最久|耗时最长)")),
    ("logs", _cue(r"logs?|log lines?|error messages?|exceptions?|stack ?traces?|"
                  r"templates?|log patterns?",
                  r"日志|报错信息|错误信息|异常信息|模板")),
    ("changes", _cue(r"what changed|changes?|changed|deploy\w*|rolled out|rollouts?|"
                     r"canar(?:y|ies)|config\w*|releases?|released",
                     r"变更|改动|变动|发布|发版|部署|上线|灰度|金丝雀|配置|改了什么|变化")),
    ("saturation", _cue(r"saturat\w*|queues?|queued|queue depth|kv[- ]?cache|replicas?|cpu|"
                        r"memory|rss|utili[sz]\w*|capacity|headroom|gpu|busy|overloaded",
                        r"饱和|队列|排队|缓存|副本|内存|负载|容量|显存|繁忙")),
    ("latency", _cue(r"p\s?\d{2,3}(?:\.\d+)?|percentiles?|median|latenc(?:y|ies)|"
                     r"response times?|how (?:slow|fast)|durations?|slow",
                     r"延迟|时延|耗时|响应时间|分位|中位数|多慢|多快|慢")),
]

VERSION = re.compile(rf"{_L}(v\d+(?:\.\d+)*){_R}", re.I)
# "5xx": the HTTP class the one meaning of failed counts (aiops.semconv), as 500 or 503 do.
FAILED = _cue(r"fail\w*|errors?|erroring|5\d\d|5xx|broken", r"失败|报错|错误|出错")
NEW = _cue(r"new|(?:never|not|haven't|hasn't|have not|has not)(?:[\s-]been)?[\s-]seen|"
           r"first[\s-]seen|unseen|novel", r"新的|新出现|新增|首次出现|没见过|新模板")
# The Chinese forms take the English noun too ("各个replica").
BY_VERSION = _cue(r"(?:per|by|each|every|for each|across|all) versions?|versions?",
                  r"(?:按|各|每个|分|各个)\s*(?:版本|versions?)|版本")
BY_REPLICA = _cue(r"(?:per|by|each|every|for each|across) replicas?",
                  r"(?:按|各|每个|各个|分)\s*(?:副本|replicas?)")

_PERCENTILE = re.compile(
    rf"{_L}p\s?(\d{{2,3}}(?:\.\d+)?){_R}|{_L}(\d{{1,2}}(?:\.\d+)?)(?:th|st|nd|rd)?[ -]?"
    rf"percentile{_R}|"
    r"(\d{1,2}(?:\.\d+)?)\s*分位|(median|中位数?)", re.I)


def percentiles(question: str) -> list[float]:
    """The percentiles a question names, in order: p99, 99th percentile, 99分位, median
    (p999 is 99.9)."""
    out: list[float] = []
    for m in _PERCENTILE.finditer(question):
        if m.group(4):
            value = 50.0
        else:
            digits = m.group(1) or m.group(2) or m.group(3)
            value = float(digits)
            if m.group(1) and "." not in digits and len(digits) == 3:
                value = float(digits[:2] + "." + digits[2:])  # p999 -> 99.9
        if 0 < value < 100 and value not in out:
            out.append(value)
    return out


_WINDOW = re.compile(
    r"(?<![a-z])(?:last|past|previous)\s+(?:(\d+(?:\.\d+)?)\s*)?"
    r"(s|secs?|seconds?|m|mins?|minutes?|h|hrs?|hours?|d|days?)\b", re.I)
_ZH_WINDOW = re.compile(r"(?:过去|最近|近|前)\s*(\d+(?:\.\d+)?|[一二两三四五六七八九十半]+)?"
                        r"\s*个?\s*(秒钟?|分钟|分|小时|钟头|天|日)")
_HALF_HOUR = re.compile(r"(?<![a-z])(?:last|past|previous)\s+half(?:\s+an)?\s+hour\b", re.I)
_UNITS = {"s": 1 / 60, "m": 1.0, "h": 60.0, "d": 24 * 60.0}
_ZH_UNITS = {"秒": 1 / 60, "分": 1.0, "小": 60.0, "钟": 60.0, "天": 24 * 60.0, "日": 24 * 60.0}
_ZH_DIGITS = {"一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8,
              "九": 9}


def _zh_number(text: str) -> float:
    """Chinese numerals up to 99 (十 = 10, 二十五 = 25), 半 = 0.5."""
    if text == "半":
        return 0.5
    if "十" in text:
        tens, _, ones = text.partition("十")
        return float(_ZH_DIGITS.get(tens, 1) * 10 + _ZH_DIGITS.get(ones, 0))
    return float(_ZH_DIGITS.get(text, 1))


def window_minutes(question: str) -> float | None:
    """The time window a question names, in minutes ("last 10 minutes", "过去2小时")."""
    m = _WINDOW.search(question)
    if m is not None:
        n = float(m.group(1)) if m.group(1) else 1.0
        return n * _UNITS[m.group(2)[0].lower()]
    z = _ZH_WINDOW.search(question)
    if z is not None:
        raw = z.group(1)
        n = 1.0 if not raw else float(raw) if raw[0].isdigit() else _zh_number(raw)
        return n * _ZH_UNITS[z.group(2)[0]]
    if "半小时" in question or _HALF_HOUR.search(question):
        return 30.0
    return None


_ZH_ACTIONS = {"回滚": "rollback", "回退": "rollback", "扩容": "scale", "加副本": "scale",
               "增加副本": "scale", "全量": "promote", "推全": "promote", "限流": "shed_load",
               "降载": "shed_load"}
_ZH_ASKING = re.compile(r"为什么|为何|吗|[?\uff1f]|什么|是否|有没有|多少")


def zh_action(question: str) -> str | None:
    """The action a Chinese imperative asks for ("回滚聊天模型", "请给嵌入模型扩容"); a
    question about an action ("为什么回滚了?") is not one."""
    if _ZH_ASKING.search(question):
        return None
    for word, action in _ZH_ACTIONS.items():
        if word in question:
            return action
    return None


_WORD_MULTIPLES = {"double": 2.0, "twice": 2.0, "triple": 3.0, "thrice": 3.0,
                   "quadruple": 4.0, "half again": 1.5, "翻倍": 2.0, "翻一番": 2.0, "双倍": 2.0}
_NUMBER_MULTIPLE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:x|\u00d7|times|倍)(?![a-z])", re.I)
_MORE = re.compile(r"(\d+(?:\.\d+)?)\s*%\s*more", re.I)
_ZH_NUMBER_MULTIPLE = re.compile(r"([一二两三四五六七八九十]+)\s*倍")


def load_multiple(question: str) -> float | None:
    """The multiple of today's load a capacity question asks about (2.0 for "2x", "double",
    "两倍"; 1.5 for "50% more"), None when it names none."""
    if m := _MORE.search(question):
        return 1 + float(m.group(1)) / 100
    if m := _NUMBER_MULTIPLE.search(question):
        return float(m.group(1))
    if m := _ZH_NUMBER_MULTIPLE.search(question):
        return _zh_number(m.group(1))
    q = question.lower()
    return next((v for word, v in _WORD_MULTIPLES.items() if word in q), None)
