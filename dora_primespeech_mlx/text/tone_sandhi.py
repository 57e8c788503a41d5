"""Mandarin tone sandhi on jieba words, as the original GPT-SoVITS front end applies it.

Input is a word, its jieba part-of-speech tag and its pypinyin finals with tone digits
(``["ia1", "i3"]``); output is the finals after the sandhi rules, applied in the order
不 -> 一 -> neutral tone -> third tone. Before that, :meth:`ToneSandhi.pre_merge_for_modify`
re-groups jieba's words so the rules see 不/一 with their neighbour, reduplications, 儿 and runs of
third tones as one word.

The rules (and their quirks) follow PaddleSpeech's ``tone_sandhi.py`` as used by GPT-SoVITS v2,
because the pretrained models were trained on its output.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from functools import lru_cache

from pypinyin import Style, lazy_pinyin

logger = logging.getLogger(__name__)

Word = list  # [word, pos]; jieba pairs and tuples are accepted as input

# Words whose last syllable is said in the neutral tone.
MUST_NEUTRAL_TONE_WORDS = frozenset(
    (
        "一辈 丈人 丈夫 上司 上头 下巴 下水 不在 不由 世故 东家 东西 两口 丧气 丫头 主意 买卖 事情 云彩 交情 "
        "亲家 亲戚 人家 什么 介绍 休息 伙计 似的 位置 体面 作坊 佩服 使唤 便宜 倒腾 兄弟 先生 关系 养活 冒失 "
        "冤家 冤枉 冷战 凉快 凑合 凤凰 出息 分析 利害 利索 利落 别扭 刺激 刺猬 前头 力气 功夫 动弹 动静 勤快 "
        "匀称 包涵 包袱 千斤 厉害 厚道 口袋 叫唤 吆喝 合同 吉他 名堂 名字 后头 吓唬 含糊 告示 告诉 和尚 咕噜 "
        "咖喱 咳嗽 哆嗦 哈欠 哑巴 唾沫 商量 喇叭 喇嘛 喉咙 喜欢 喽啰 嘀咕 嘟囔 嘱咐 嘴巴 困难 在乎 地方 地道 "
        "壮实 外甥 多么 多少 大人 大夫 大意 大方 大爷 太阳 头发 女婿 奴才 妖精 妥当 妯娌 姐夫 姑娘 委屈 姥爷 "
        "娘家 婆家 媒人 媳妇 嫁妆 字号 学生 学问 官司 实在 客气 家伙 寒碜 寡妇 对付 对头 将就 小伙 小气 少爷 "
        "尾巴 屁股 岁数 工夫 差事 巴掌 巴结 师傅 师父 希罕 帐篷 帮手 干事 幸福 庄稼 应酬 开通 弄堂 弟兄 张罗 "
        "得罪 心思 志气 忙活 快活 念叨 念头 怎么 思量 怪物 悟性 情形 惦记 意思 意识 懒得 戒指 扁担 扎实 扑腾 "
        "打发 打听 打扮 打点 打算 打量 扫帚 扫把 折腾 护士 报复 抬举 拖沓 招呼 招牌 拨弄 拳头 拾掇 指头 指甲 "
        "挑剔 挖苦 提防 收成 收拾 故事 新鲜 时候 明白 暖和 月亮 月饼 朋友 木匠 木头 本事 机灵 枇杷 枕头 架势 "
        "柴火 栅栏 核桃 棉花 棒槌 棺材 槟榔 模糊 欺负 正经 母亲 比方 泥鳅 活泼 浪头 消息 清楚 温和 溜达 滑溜 "
        "漂亮 火候 灯笼 炊帚 点心 烂糊 烟筒 烧饼 热闹 照顾 熟悉 爱人 父亲 爽快 牌楼 牙碜 牢骚 牲口 特务 状元 "
        "狐狸 玄乎 玫瑰 玻璃 琉璃 琢磨 琵琶 甘蔗 甜头 生意 畜生 疏忽 疙瘩 疟疾 痛快 痢疾 白净 盘算 盘缠 相声 "
        "眉毛 眨巴 眯缝 眼睛 知识 石匠 石头 石榴 码头 砚台 祖宗 福气 秀才 秀气 秧歌 称呼 稀罕 稳当 窗户 窝囊 "
        "窟窿 笑话 笑语 笤帚 答应 算盘 算计 篱笆 簸箕 粮食 精神 糊涂 糟蹋 糨糊 累赘 红火 结实 编辑 罐头 罗嗦 "
        "翻腾 老太 老头 老婆 老实 老爷 耳朵 耷拉 耽搁 耽误 聪明 胡同 胡琴 胡萝 胭脂 胳膊 能耐 脊梁 脑袋 脾气 "
        "膏药 自在 舌头 舒坦 舒服 芝麻 苍蝇 苗头 苗条 荒唐 荸荠 菩萨 萝卜 葡萄 葫芦 薄荷 蘑菇 蚂蚱 蛤蟆 蜡烛 "
        "行当 行李 街坊 衙门 衣服 衣裳 补丁 裁缝 见识 规矩 计划 认识 记号 记性 讲究 豆腐 财主 费用 趔趄 跟头 "
        "跳蚤 踏实 转悠 软和 过去 运气 这个 这么 连累 迷糊 造化 逻辑 道士 邋遢 那个 那么 部分 里头 里脊 钥匙 "
        "铁匠 铃铛 铺盖 锄头 门道 闺女 阔气 队伍 难为 风筝 馄饨 馒头 首饰 马虎 骆驼 骨头 高粱 鸳鸯 麻利 麻烦"
    ).split()
)

# Words excluded from the reduplication / 们子 neutral-tone rules.
MUST_NOT_NEUTRAL_TONE_WORDS = frozenset(
    (
        "人人 以下 佼佼 冉冉 分子 卵子 原子 吵吵 哈哈 女子 娃哈哈 学子 家家户户 局地 干嘛 幺幺 恳恳 想想 "
        "打打 攘攘 数数 整整 死死 熙熙 瓜子 电子 男子 留得 石子 算子 考考 耕地 花花草草 莘莘 莲子 落地 虎虎 "
        "袅袅 量子 青青"
    ).split()
)

_MODAL_PARTICLES = "吧呢哈啊呐噻嘛吖嗨呐哦哒额滴哩哟喽啰耶喔诶"
_YI_PUNCTUATION = "：，；。？！“”‘’':,;.?!"  # after these 一 keeps tone 1


def _with_tone(final: str, tone: str) -> str:
    return final[:-1] + tone


def _all_tone_three(finals: list[str]) -> bool:
    return all(f[-1] == "3" for f in finals)


def _is_reduplication(word: str) -> bool:
    return len(word) == 2 and word[0] == word[1]


@lru_cache(maxsize=8192)
def _finals(word: str) -> tuple[str, ...]:
    """pypinyin finals with tone digits (5 = neutral) of a word; cached, words repeat a lot."""
    return tuple(lazy_pinyin(word, neutral_tone_with_five=True, style=Style.FINALS_TONE3))


def _is_neutral_listed(word: str) -> bool:
    return word in MUST_NEUTRAL_TONE_WORDS or word[-2:] in MUST_NEUTRAL_TONE_WORDS


def _try(step, seg: list) -> list:
    """Run a merge step; a failing step leaves the words as they were (the reference prints and
    goes on)."""
    try:
        return step(seg)
    except Exception as exc:  # noqa: BLE001 - same recovery as the reference
        logger.debug("tone sandhi: %s failed on %r: %s", step.__name__, seg, exc)
        return seg


class ToneSandhi:
    """Tone sandhi rules.

    ``cut_for_search`` is jieba's search-mode segmenter (``jieba_fast.cut_for_search``), used to
    split a word into two parts; the caller owns jieba's (lazy) loading.
    """

    def __init__(self, cut_for_search: Callable[[str], Iterable[str]]):
        self._cut_for_search = cut_for_search

    # ---- re-grouping of jieba words -------------------------------------------------------

    def pre_merge_for_modify(self, seg: list) -> list[Word]:
        """Merge jieba's (word, pos) list so the sandhi rules see whole units."""
        seg = self._merge_bu(seg)
        seg = _try(self._merge_yi, seg)
        seg = self._merge_reduplication(seg)
        seg = _try(self._merge_continuous_three_tones, seg)
        seg = _try(self._merge_continuous_three_tones_2, seg)
        return self._merge_er(seg)

    @staticmethod
    def _merge_bu(seg: list) -> list[Word]:
        """不 joins the word after it (a trailing 不 stays, tagged d)."""
        merged, last = [], ""
        for word, pos in seg:
            if last == "不":
                word = last + word
            if word != "不":
                merged.append([word, pos])
            last = word
        if last == "不":
            merged.append(["不", "d"])
        return merged

    @staticmethod
    def _merge_yi(seg: list) -> list[Word]:
        """听 一 听 -> 听一听 (verbs); then a lone 一 joins the word after it."""
        merged, i = [], 0
        while i < len(seg):
            word, pos = seg[i]
            if i >= 1 and word == "一" and i + 1 < len(seg):
                last = merged[-1] if merged else seg[i - 1]
                following = seg[i + 1]
                if last[0] == following[0] and last[1] == "v" and following[1] == "v":
                    merged[-1] = [last[0] + "一" + following[0], last[1]]
                    i += 2
                    continue
            merged.append([word, pos])
            i += 1
        joined: list[Word] = []
        for word, pos in merged:
            if joined and joined[-1][0] == "一":
                joined[-1][0] += word
            else:
                joined.append([word, pos])
        return joined

    @staticmethod
    def _merge_reduplication(seg: list) -> list[Word]:
        merged: list[Word] = []
        for word, pos in seg:
            if merged and word == merged[-1][0]:
                merged[-1][0] += word
            else:
                merged.append([word, pos])
        return merged

    @staticmethod
    def _merge_three_tones(seg: list, joins) -> list[Word]:
        """Join a word to the previous one when joins(prev_finals, finals) and the two are at
        most 3 characters together (a reduplication is never joined, it needs the neutral tone)."""
        finals = [_finals(word) for word, _ in seg]
        merged: list[Word] = []
        merged_last = [False] * len(seg)
        for i, (word, pos) in enumerate(seg):
            if i >= 1 and joins(finals[i - 1], finals[i]) and not merged_last[i - 1]:
                previous = seg[i - 1][0]
                if not _is_reduplication(previous) and len(previous) + len(word) <= 3:
                    merged[-1][0] += word
                    merged_last[i] = True
                    continue
            merged.append([word, pos])
        return merged

    def _merge_continuous_three_tones(self, seg: list) -> list[Word]:
        """Both words entirely third tone."""
        return self._merge_three_tones(seg, lambda a, b: _all_tone_three(a) and _all_tone_three(b))

    def _merge_continuous_three_tones_2(self, seg: list) -> list[Word]:
        """Last syllable of the first and first syllable of the second word third tone."""
        return self._merge_three_tones(seg, lambda a, b: a[-1][-1] == "3" and b[0][-1] == "3")

    @staticmethod
    def _merge_er(seg: list) -> list[Word]:
        merged: list[Word] = []
        for i, (word, pos) in enumerate(seg):
            if i >= 1 and word == "儿" and seg[i - 1][0] != "#":
                merged[-1][0] += word
            else:
                merged.append([word, pos])
        return merged

    # ---- the sandhi rules -------------------------------------------------------------------

    def modified_tone(self, word: str, pos: str, finals: list[str]) -> list[str]:
        """Finals of word after the 不, 一, neutral-tone and third-tone rules."""
        finals = self._bu_sandhi(word, finals)
        finals = self._yi_sandhi(word, finals)
        finals = self._neutral_sandhi(word, pos, finals)
        return self._three_sandhi(word, finals)

    def _split_word(self, word: str) -> list[str]:
        """Two parts of a word: its shortest search-mode sub-word and the rest, in text order."""
        first = sorted(self._cut_for_search(word), key=len)[0]
        if word.find(first) == 0:
            return [first, word[len(first) :]]
        return [word[: -len(first)], first]

    @staticmethod
    def _bu_sandhi(word: str, finals: list[str]) -> list[str]:
        if len(word) == 3 and word[1] == "不":  # 看不懂
            finals[1] = _with_tone(finals[1], "5")
            return finals
        for i, char in enumerate(word):
            if char == "不" and i + 1 < len(word) and finals[i + 1][-1] == "4":  # 不怕
                finals[i] = _with_tone(finals[i], "2")
        return finals

    @staticmethod
    def _yi_sandhi(word: str, finals: list[str]) -> list[str]:
        if "一" in word and all(c.isnumeric() for c in word if c != "一"):
            return finals  # 一 among numerals (一零零, 二一零) keeps tone 1
        if len(word) == 3 and word[1] == "一" and word[0] == word[-1]:  # 看一看
            finals[1] = _with_tone(finals[1], "5")
        elif word.startswith("第一"):
            finals[1] = _with_tone(finals[1], "1")
        else:
            for i, char in enumerate(word):
                if char != "一" or i + 1 >= len(word):
                    continue
                if finals[i + 1][-1] == "4":  # 一段
                    finals[i] = _with_tone(finals[i], "2")
                elif word[i + 1] not in _YI_PUNCTUATION:  # 一天
                    finals[i] = _with_tone(finals[i], "4")
        return finals

    def _neutral_sandhi(self, word: str, pos: str, finals: list[str]) -> list[str]:
        # reduplicated nouns/verbs/adjectives: 奶奶, 试试
        for j in range(1, len(word)):
            if word[j] == word[j - 1] and pos[0] in {"n", "v", "a"} and word not in MUST_NOT_NEUTRAL_TONE_WORDS:
                finals[j] = _with_tone(finals[j], "5")
        ge = word.find("个")
        last = word[-1]
        if last in _MODAL_PARTICLES or last in "的地得":
            finals[-1] = _with_tone(finals[-1], "5")
        elif len(word) == 1 and word in "了着过" and pos in {"ul", "uz", "ug"}:  # 走了, 看着
            finals[-1] = _with_tone(finals[-1], "5")
        elif len(word) > 1 and last in "们子" and pos in {"r", "n"} and word not in MUST_NOT_NEUTRAL_TONE_WORDS:
            finals[-1] = _with_tone(finals[-1], "5")
        elif len(word) > 1 and last in "上下里" and pos in {"s", "l", "f"}:  # 桌上, 家里
            finals[-1] = _with_tone(finals[-1], "5")
        elif len(word) > 1 and last in "来去" and word[-2] in "上下进出回过起开":  # 上来, 下去
            finals[-1] = _with_tone(finals[-1], "5")
        elif (ge >= 1 and (word[ge - 1].isnumeric() or word[ge - 1] in "几有两半多各整每做是")) or word == "个":
            finals[ge] = _with_tone(finals[ge], "5")  # 个 as a measure word
        elif _is_neutral_listed(word):
            finals[-1] = _with_tone(finals[-1], "5")

        parts = self._split_word(word)
        halves = [finals[: len(parts[0])], finals[len(parts[0]) :]]
        for part, half in zip(parts, halves):
            if _is_neutral_listed(part):
                half[-1] = _with_tone(half[-1], "5")
        return halves[0] + halves[1]

    def _three_sandhi(self, word: str, finals: list[str]) -> list[str]:
        if len(word) == 2 and _all_tone_three(finals):
            finals[0] = _with_tone(finals[0], "2")
        elif len(word) == 3:
            parts = self._split_word(word)
            if _all_tone_three(finals):
                if len(parts[0]) == 2:  # 蒙古/包
                    finals[0] = _with_tone(finals[0], "2")
                    finals[1] = _with_tone(finals[1], "2")
                elif len(parts[0]) == 1:  # 纸/老虎
                    finals[1] = _with_tone(finals[1], "2")
            else:
                first, second = finals[: len(parts[0])], finals[len(parts[0]) :]
                for i, half in enumerate((first, second)):
                    if _all_tone_three(half) and len(half) == 2:  # 所有/人
                        half[0] = _with_tone(half[0], "2")
                    elif i == 1 and not _all_tone_three(half) and half[0][-1] == "3" and first[-1][-1] == "3":
                        first[-1] = _with_tone(first[-1], "2")  # 好/喜欢
                finals = first + second
        elif len(word) == 4:  # idioms: two halves of two
            first, second = finals[:2], finals[2:]
            for half in (first, second):
                if _all_tone_three(half):
                    half[0] = _with_tone(half[0], "2")
            finals = first + second
        return finals
