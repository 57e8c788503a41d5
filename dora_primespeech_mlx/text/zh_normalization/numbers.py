"""Reading numbers aloud in Chinese, and the number rules of the normaliser.

``num2str`` is the cardinal reader every other rule uses (``"1050"`` -> 一千零五十,
``"3.20"`` -> 三点二零, ``".5"`` -> 零点五); ``verbalize_digit`` reads digit by digit, with ``1``
as 幺 where the reference does (telephone numbers, long digit runs).

The ``replace_*`` functions are ``re.sub`` callbacks; their patterns sit next to them.
"""

from __future__ import annotations

import re

DIGITS = dict(zip("0123456789", "零一二三四五六七八九"))
# Number of trailing digits each unit stands for; largest first for the split below.
_UNITS = ((8, "亿"), (4, "万"), (3, "千"), (2, "百"), (1, "十"))

# Measure words (and units) that make a number a quantity: "2个" reads 两个, not 二个.
# Order is kept from the reference pattern; only whether some alternative matches matters.
_QUANTIFIERS = (
    "处 台 架 枚 趟 幅 平 方 堵 间 床 株 批 项 例 列 篇 栋 注 亩 封 艘 把 目 套 段 人 所 朵 匹 张 座 回 场 "
    "尾 条 个 首 阙 阵 网 炮 顶 丘 棵 只 支 袭 辆 挑 担 颗 壳 窠 曲 墙 群 腔 砣 座 客 贯 扎 捆 刀 令 打 手 "
    "罗 坡 山 岭 江 溪 钟 队 单 双 对 出 口 头 脚 板 跳 枝 件 贴 针 线 管 名 位 身 堂 课 本 页 家 户 层 丝 "
    "毫 厘 分 钱 两 斤 担 铢 石 钧 锱 忽 千克 毫克 微克 毫 厘 公分 分 寸 尺 丈 里 寻 常 铺 程 千米 分米 厘米 "
    "毫米 微米 米 撮 勺 合 升 斗 石 盘 碗 碟 叠 桶 笼 盆 盒 杯 钟 斛 锅 簋 篮 盘 桶 罐 瓶 壶 卮 盏 箩 箱 煲 "
    "啖 袋 钵 年 月 日 季 刻 时 周 天 秒 分 小时 旬 纪 岁 世 更 夜 春 夏 秋 冬 代 伏 辈 丸 泡 粒 颗 幢 堆 条 "
    "根 支 道 面 片 张 颗 块 元 亿 千万 百万 万 千 百 亿元 千万元 百万元 万元 千元 百元 美元 元 亿吨 千万吨 "
    "百万吨 万吨 千吨 百吨 十吨 吨 亿块 千万块 百万块 万块 千块 百块 块 角 毛 分"
).split()


def _spell(value: str, use_zero: bool = True) -> list[str]:
    """Symbols for a digit string (leading zeros mark a 零 inside a larger number)."""
    stripped = value.lstrip("0")
    if not stripped:
        return []
    if len(stripped) == 1:
        if use_zero and len(stripped) < len(value):
            return [DIGITS["0"], DIGITS[stripped]]
        return [DIGITS[stripped]]
    size, unit = next((n, u) for n, u in _UNITS if n < len(stripped))
    return _spell(value[:-size]) + [unit] + _spell(value[-size:])


def verbalize_cardinal(value: str) -> str:
    """An integer digit string as a cardinal: ``"105"`` -> 一百零五, ``"12"`` -> 十二."""
    if not value:
        return ""
    value = value.lstrip("0")
    if not value:
        return DIGITS["0"]
    symbols = _spell(value)
    if len(symbols) >= 2 and symbols[0] == DIGITS["1"] and symbols[1] == "十":
        symbols = symbols[1:]  # 一十二 is said 十二
    return "".join(symbols)


def verbalize_digit(value: str, alt_one: bool = False) -> str:
    """Digit by digit; ``alt_one`` reads ``1`` as 幺."""
    text = "".join(DIGITS[d] for d in value)
    return text.replace("一", "幺") if alt_one else text


def num2str(value: str) -> str:
    """A non-negative decimal string (``"12"``, ``"3.05"``, ``".5"``) read as a number."""
    parts = value.split(".")
    if len(parts) > 2:
        raise ValueError(f"number {value!r} has more than one decimal point")
    integer, decimal = (parts[0], "") if len(parts) == 1 else parts
    text = verbalize_cardinal(integer)
    # Trailing zeros collapse to a single one: "3.200" -> 三点二零, "3.0" -> 三点零.
    decimal = decimal.rstrip("0") + "0" if decimal.endswith("0") else decimal
    if decimal:
        text = (text or DIGITS["0"]) + "点" + verbalize_digit(decimal)
    return text


def _sign(text: str, word: str = "负") -> str:
    return word if text else ""


# 3/4 -> 四分之三
RE_FRAC = re.compile(r"(-?)(?<!\d)(\d+)/(\d+)")


def replace_frac(m: re.Match) -> str:
    return f"{_sign(m.group(1))}{num2str(m.group(3))}分之{num2str(m.group(2))}"


# 12.5% -> 百分之十二点五
RE_PERCENTAGE = re.compile(r"(-?)(?<!\d)(\d+(\.\d+)?)%")


def replace_percentage(m: re.Match) -> str:
    return f"{_sign(m.group(1))}百分之{num2str(m.group(2))}"


# A minus sign directly before digits: -10 -> 负十
RE_INTEGER = re.compile(r"(-)(\d+)")


def replace_negative_num(m: re.Match) -> str:
    return f"{_sign(m.group(1))}{num2str(m.group(2))}"


# Three or more digits that no other rule took: read digit by digit (00078 -> 零零零七八).
RE_DEFAULT_NUM = re.compile(r"\d{3}\d*")


def replace_default_num(m: re.Match) -> str:
    return verbalize_digit(m.group(0), alt_one=True)


# Arithmetic: the operator between two operands becomes a word, operands stay for later rules.
_POWERS = "⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ"
_OPERAND = rf"((-?)(?<!\d)((\d+)(\.\d+)?[{_POWERS}]*)|(\.\d+[{_POWERS}]*)|([A-Za-z][{_POWERS}]*))"
RE_ASMD = re.compile(_OPERAND + r"([\+\-×÷=])" + _OPERAND)
_ASMD_WORDS = {"+": "加", "-": "减", "×": "乘", "÷": "除", "=": "等于"}


def replace_asmd(m: re.Match) -> str:
    return m.group(1) + _ASMD_WORDS[m.group(8)] + m.group(9)


# Superscripts: 2³ -> 2的3次方
RE_POWER = re.compile(rf"[{_POWERS}]+")
_POWER_PLAIN = str.maketrans(_POWERS, "0123456789xyn")


def replace_power(m: re.Match) -> str:
    return "的" + m.group(0).translate(_POWER_PLAIN) + "次方"


RE_DECIMAL_NUM = re.compile(r"(-?)(?<!\d)((\d+)(\.\d+))|(\.(\d+))")
RE_NUMBER = re.compile(r"(-?)((\d+)(\.\d+)?)|(\.(\d+))")
RE_POSITIVE_QUANTIFIERS = re.compile(r"(?<!\d)(\d+)([多余几\+])?(" + "|".join(_QUANTIFIERS) + ")")


def replace_positive_quantifier(m: re.Match) -> str:
    number = num2str(m.group(1))
    if number == "二":
        number = "两"
    approx = "多" if m.group(2) == "+" else (m.group(2) or "")
    return f"{number}{approx}{m.group(3)}"


def replace_number(m: re.Match) -> str:
    if m.group(5):  # ".25" -> 零点二五
        return num2str(m.group(5))
    return f"{_sign(m.group(1))}{num2str(m.group(2))}"


# 1~5 (no operator or digit around) -> 一到五
RE_RANGE = re.compile(r"(?<![\d\+\-×÷=])((-?)((\d+)(\.\d+)?))[-~]((-?)((\d+)(\.\d+)?))(?![\d\+\-×÷=])")


def replace_range(m: re.Match) -> str:
    first = RE_NUMBER.sub(replace_number, m.group(1))
    second = RE_NUMBER.sub(replace_number, m.group(6))
    return f"{first}到{second}"


# 10%~20%, 3m~5m: the tilde between two numbers with a unit reads 至
_RANGE_UNITS = r"(%|°C|℃|度|摄氏度|cm2|cm²|cm3|cm³|cm|db|ds|kg|km|m2|m²|m³|m3|ml|m|mm|s)"
# A number starts where no digit precedes it (a later start in a digit run gives the same match; without the
# lookbehind every start rescans the run: quadratic) or right after a unit that ends in a digit (m2, cm3).
_PLAIN_NUMBER = r"((-?)(?:(?<!\d)|(?<=m[23]))((\d+)(\.\d+)?)|(\.(\d+)))"
RE_TO_RANGE = re.compile(_PLAIN_NUMBER + _RANGE_UNITS + "[~]" + _PLAIN_NUMBER + _RANGE_UNITS)


def replace_to_range(m: re.Match) -> str:
    return m.group(0).replace("~", "至")


# Version-like numbers with two or more dots: 1.2.3 -> 一点二点三
RE_VERSION_NUM = re.compile(r"(?<!\d)((\d+)(\.\d+)(\.\d+)?(\.\d+)+)")


def replace_version_num(m: re.Match) -> str:
    return "".join("点" if c == "." else num2str(c) for c in m.group(1))
