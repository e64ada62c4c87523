"""Porter's stemming algorithm (1980), as SQLite FTS5's ``porter`` tokenizer applies it.

`MemoryVectorStore` stems its keywords with it, so its keyword ranking matches the SQLite store's
("baking" finds "baked"). Lower-case ASCII words of 3 to 64 letters are stemmed; others stay.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final

__all__ = ["stem"]

_VOWELS: Final = frozenset("aeiou")

_STEP2: Final = (
    ("ational", "ate"), ("tional", "tion"), ("enci", "ence"), ("anci", "ance"), ("izer", "ize"), ("bli", "ble"),
    ("alli", "al"), ("entli", "ent"), ("eli", "e"), ("ousli", "ous"), ("ization", "ize"), ("ation", "ate"),
    ("ator", "ate"), ("alism", "al"), ("iveness", "ive"), ("fulness", "ful"), ("ousness", "ous"), ("aliti", "al"),
    ("iviti", "ive"), ("biliti", "ble"), ("logi", "log"),
)
_STEP3: Final = (
    ("icate", "ic"), ("ative", ""), ("alize", "al"), ("iciti", "ic"), ("ical", "ic"), ("ful", ""), ("ness", ""),
)
_STEP4: Final = (
    "al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent", "ion", "ou", "ism", "ate",
    "iti", "ous", "ive", "ize",
)


def _consonant(word: str, i: int) -> bool:
    c = word[i]
    if c in _VOWELS:
        return False
    if c == "y":
        return i == 0 or not _consonant(word, i - 1)
    return True


def _measure(stem: str) -> int:
    """Count the vowel-consonant sequences of `stem` (m in [C](VC)^m[V])."""
    m, i, n = 0, 0, len(stem)
    while i < n and _consonant(stem, i):
        i += 1
    while i < n:
        while i < n and not _consonant(stem, i):
            i += 1
        if i == n:
            break
        while i < n and _consonant(stem, i):
            i += 1
        m += 1
    return m


def _has_vowel(stem: str) -> bool:
    return any(not _consonant(stem, i) for i in range(len(stem)))


def _double_consonant(word: str) -> bool:
    return len(word) >= 2 and word[-1] == word[-2] and (word[-1] == "y" or _consonant(word, len(word) - 1))


def _cvc(word: str) -> bool:
    """Tell whether `word` ends consonant-vowel-consonant, the last not w, x or y (hop, not hoop, snow)."""
    n = len(word)
    return (n >= 3 and _consonant(word, n - 3) and not _consonant(word, n - 2) and _consonant(word, n - 1)
            and word[-1] not in "wxy")


def _replace(word: str, rules: tuple[tuple[str, str], ...], minimum: int) -> str:
    """Apply the rule with the longest matching suffix, if the rest's measure exceeds `minimum`."""
    best = max((r for r in rules if word.endswith(r[0])), key=lambda r: len(r[0]), default=None)
    if best is not None and _measure(word[:-len(best[0])]) > minimum:
        return word[:-len(best[0])] + best[1]
    return word


@lru_cache(maxsize=65_536)
def stem(word: str) -> str:
    """Return `word`'s Porter stem.

    >>> [stem(w) for w in ("baking", "baked", "ponies", "relational", "hopping", "happy", "sky")]
    ['bake', 'bake', 'poni', 'relat', 'hop', 'happi', 'sky']
    """
    if not 3 <= len(word) <= 64 or not word.isascii() or not word.isalpha() or not word.islower():
        return word
    word = _step1(word)
    word = _replace(word, _STEP2, 0)  # double suffixes
    word = _replace(word, _STEP3, 0)  # single ones
    return _step5(_step4(word))


def _step1(word: str) -> str:
    """Strip plurals, -eed, -ed and -ing; turn a final -y after a vowel in the stem into -i."""
    if word.endswith(("sses", "ies")) and len(word) > 4 - word.endswith("ies"):  # (a stem must be left)
        word = word[:-2]
    elif word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    if word.endswith("eed") and len(word) > 3:
        if _measure(word[:-3]) > 0:
            word = word[:-1]
    else:
        suffix = "ed" if word.endswith("ed") else "ing" if word.endswith("ing") else ""
        if suffix and _has_vowel(word[:-len(suffix)]):
            word = _tidy(word[:-len(suffix)])
    if word.endswith("y") and _has_vowel(word[:-1]):
        word = word[:-1] + "i"
    return word


def _tidy(word: str) -> str:
    """Mend what is left once -ed or -ing went: conflat(e), hop(p), fil(e)."""
    if word.endswith(("at", "bl", "iz")):
        return word + "e"
    if _double_consonant(word) and word[-1] not in "lsz":
        return word[:-1]
    if _measure(word) == 1 and _cvc(word):
        return word + "e"
    return word


def _step4(word: str) -> str:
    """Drop the suffixes of step 4 where the stem is long enough."""
    suffix = max((s for s in _STEP4 if word.endswith(s)), key=len, default=None)
    if suffix is not None:
        rest = word[:-len(suffix)]
        if _measure(rest) > 1 and (suffix != "ion" or rest.endswith(("s", "t"))):
            return rest
    return word


def _step5(word: str) -> str:
    """Drop a final -e, and the second l of -ll."""
    if word.endswith("e"):
        rest = word[:-1]
        m = _measure(rest)
        if m > 1 or (m == 1 and not _cvc(rest)):
            word = rest
    if word.endswith("ll") and _measure(word) > 1:
        word = word[:-1]
    return word
