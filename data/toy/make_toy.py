"""Write the course's toy parallel corpus (English / German / French) into this folder.

The corpus is written by the course team from a small hand-made grammar — subject (with
article and adjective, agreeing in gender), verb, place, and an optional "today" — so that
every German and French sentence is grammatical and the corpus can be shared freely (CC0).
It is for fast tests and demos: a model learns it in seconds. Deterministic; re-run with
``python data/toy/make_toy.py`` and the files come out byte for byte the same.
"""
from __future__ import annotations

import itertools
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent

# english, german noun, german gender, french noun, french gender
SUBJECTS = [
    ("dog", "Hund", "m", "chien", "m"),
    ("cat", "Katze", "f", "chat", "m"),
    ("man", "Mann", "m", "homme", "m"),
    ("woman", "Frau", "f", "femme", "f"),
    ("child", "Kind", "n", "enfant", "m"),
    ("girl", "Mädchen", "n", "fille", "f"),
    ("boy", "Junge", "m", "garçon", "m"),
    ("bird", "Vogel", "m", "oiseau", "m"),
]
# english, german stem, french masculine, french feminine, french position ("pre" or "post")
ADJECTIVES = [
    None,
    ("small", "klein", "petit", "petite", "pre"),
    ("big", "groß", "grand", "grande", "pre"),
    ("young", "jung", "jeune", "jeune", "pre"),
    ("happy", "glücklich", "heureux", "heureuse", "post"),
    ("tired", "müd", "fatigué", "fatiguée", "post"),
]
# english, german, french (masculine subject), french (feminine subject)
VERBS = [
    ("runs", "läuft", "court", "court"),
    ("sleeps", "schläft", "dort", "dort"),
    ("plays", "spielt", "joue", "joue"),
    ("waits", "wartet", "attend", "attend"),
    ("jumps", "springt", "saute", "saute"),
    ("sits", "sitzt", "est assis", "est assise"),
]
PLACES = [
    ("in the park", "im Park", "dans le parc"),
    ("in the garden", "im Garten", "dans le jardin"),
    ("on the street", "auf der Straße", "dans la rue"),
    ("on the beach", "am Strand", "sur la plage"),
    ("in the house", "im Haus", "dans la maison"),
    ("by the lake", "am See", "au bord du lac"),
    ("in the snow", "im Schnee", "dans la neige"),
]
VOWELS = "aeiouhéAEIOUH"  # French elision: l'enfant, l'homme, l'oiseau

DE_INDEFINITE = {"m": ("ein", "er"), "f": ("eine", "e"), "n": ("ein", "es")}
DE_DEFINITE = {"m": ("der", "e"), "f": ("die", "e"), "n": ("das", "e")}


def english(subject, adjective, definite, verb, place, today):
    noun = subject[0]
    words = ["the" if definite else ("an" if (adjective or (noun,))[0][0] in "aeiou" else "a")]
    if adjective:
        words.append(adjective[0])
    words += [noun, verb[0], place[0]]
    if today:
        words.append("today")
    text = " ".join(words)
    return text[0].upper() + text[1:] + "."


def german(subject, adjective, definite, verb, place, today):
    _, noun, gender, _, _ = subject
    article, ending = (DE_DEFINITE if definite else DE_INDEFINITE)[gender]
    words = [article]
    if adjective:
        words.append(adjective[1] + ending)
    words += [noun, verb[1]]
    if today:
        words.append("heute")       # German: time before place
    words.append(place[1])
    text = " ".join(words)
    return text[0].upper() + text[1:] + "."


def french(subject, adjective, definite, verb, place, today):
    _, _, _, noun, gender = subject
    adj = None
    if adjective:
        adj = adjective[2] if gender == "m" else adjective[3]
    pre = adj if adjective and adjective[4] == "pre" else None
    post = adj if adjective and adjective[4] == "post" else None
    head = pre or noun
    if definite:
        article = "l'" if head[0] in VOWELS else ("le " if gender == "m" else "la ")
    else:
        article = "un " if gender == "m" else "une "
    phrase = article + " ".join(w for w in (pre, noun, post) if w)
    words = [phrase, verb[2] if gender == "m" else verb[3], place[2]]
    if today:
        words.append("aujourd'hui")
    text = " ".join(words)
    return text[0].upper() + text[1:] + "."


def corpus():
    combos = list(itertools.product(SUBJECTS, ADJECTIVES, (False, True), VERBS, PLACES, (False, True)))
    random.Random(2024).shuffle(combos)
    return [(english(*c), german(*c), french(*c)) for c in combos]


SIZES = {"train": 400, "val": 50, "test": 50}


def main(out: Path = HERE) -> None:
    triples = corpus()
    start = 0
    for split, n in SIZES.items():
        chunk = triples[start:start + n]
        start += n
        for i, lang in enumerate(("en", "de", "fr")):
            (out / f"{split}.{lang}").write_text("".join(t[i] + "\n" for t in chunk), encoding="utf-8")


if __name__ == "__main__":
    main()
