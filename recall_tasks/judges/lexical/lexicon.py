"""The lexical judge's word lists: stop words and pronouns, negations, clause words, number, scale and
percent words, units and currencies, unit and spelling variants, irregular forms, very common English words.

Data only. Changing any entry can change a verdict: bump ``PROMPT_VERSION`` (in ``judge``).
"""

from __future__ import annotations

from typing import Final

_PRONOUNS: Final = frozenset(
    "i me my mine myself we us our ours ourselves you your yours yourself yourselves he him his himself "
    "she her hers herself it its itself they them their theirs themselves this that these those who whom "
    "whose which what whatever whoever one's".split()
)

_STOP_EN: Final = frozenset(
    "a an the and or but if then else of at by for with about against between into through during before "
    "after above below to from up down in out on off over under again further once here there when where "
    "why how all any both each few more most other some such only own same so than too very can will just "
    "should now is am are was were be been being have has had having do does did doing would could may "
    "might must shall also as until while because since though although whether either yet via per upon "
    "within among amongst around across along toward towards onto unto like unlike etc eg ie vs versus "
    "mr mrs ms dr st am pm yes ok okay let lets thus hence therefore however whereas whilst still even "
    "ever really quite rather s t d ll m o re ve y".split()
)

_STOP_OTHER: Final = frozenset(
    # Spanish
    "el la los las lo un una unos unas de del al y e o u que en es fue fueron era eran ser ha han por para "
    "con se su sus como mas pero este esta estos estas ese esa muy tambien le les nos ya entre sobre hasta "
    "desde cuando donde porque "
    # French
    "le les l des du d et ou est sont au aux dans pour sur avec ce cet cette ces qui qu il elle ils elles "
    "on nous vous sa ses leur leurs ete etait etaient mais aussi tres "
    # German
    "der das und ist von zu zum zur den dem des ein eine einer eines einem einen im mit auf fur sich wurde "
    "wurden sind auch als bei nach aus oder dass er sie es wir um".split()
)

_STOP: Final = _STOP_EN | _STOP_OTHER | _PRONOUNS

_NEGATIONS: Final = frozenset(
    "not no never none neither nor without cannot nobody nothing nowhere "
    "nunca jamas sin ni ningun ninguno ninguna tampoco "
    "ne pas jamais sans aucun aucune rien "
    "nicht kein keine keinen keinem keiner keines nie niemals ohne nichts weder "
    "non nao nem senza "
    "не нет никогда без ни δεν μην μη οχι χωρις".split()
)

_CLAUSE_WORDS: Final = frozenset(
    "but however whereas while although though yet pero sino mais cependant aber sondern jedoch".split()
)

_WORD_UNITS: Final[dict[str, int]] = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen".split()
    )
}
_WORD_TENS: Final[dict[str, int]] = {
    w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)
}
_WORD_SMALL: Final[dict[str, int]] = {**_WORD_UNITS, **_WORD_TENS}
_SCALE_WORDS: Final[dict[str, float]] = {
    "hundred": 1e2,
    "thousand": 1e3,
    "million": 1e6,
    "millions": 1e6,
    "billion": 1e9,
    "billions": 1e9,
    "trillion": 1e12,
    "trillions": 1e12,
    "mil": 1e3,
    "millon": 1e6,
    "millones": 1e6,
    "mille": 1e3,
    "milliard": 1e9,
    "milliards": 1e9,
    "tausend": 1e3,
    "millionen": 1e6,
    "milliarde": 1e9,
    "milliarden": 1e9,
    "lakh": 1e5,
    "crore": 1e7,
}
_PERCENT_WORDS: Final = frozenset({"percent", "pct", "prozent", "percentage", "porcentaje", "pourcent"})
_PERCENT_PAIRS: Final = frozenset({("per", "cent"), ("por", "ciento"), ("pour", "cent")})
_ATTACHED_SCALES: Final[dict[str, float]] = {"k": 1e3, "mn": 1e6, "mln": 1e6, "bn": 1e9, "tn": 1e12}
_CJK_SCALES: Final[dict[str, float]] = {"百": 1e2, "千": 1e3, "万": 1e4, "萬": 1e4, "亿": 1e8, "億": 1e8}
_ORDINAL_SUFFIXES: Final = frozenset({"st", "nd", "rd", "th", "s"})
_UNITS: Final = frozenset(
    "km kg cm mm mg ml g l lb lbs m mi ft h hr hrs min mins ms sec secs gb mb kb tb ghz mhz hz kw kwh mw "
    "gw gwh w v x yr yrs mph kph kmh oz t am pm c f".split()
)
_CURRENCY: Final[dict[str, str]] = {"$": "dollar", "€": "euro", "£": "pound", "¥": "yen", "₹": "rupee"}
# Units and spelling variants mapped to one form before stemming (5 m = 5 metres = 5 meters).
_CANONICAL: Final[dict[str, str]] = {
    **dict.fromkeys(["m", "meter", "meters", "metres"], "metre"),
    **dict.fromkeys(["km", "kilometer", "kilometers", "kilometres"], "kilometre"),
    **dict.fromkeys(["cm", "centimeter", "centimeters", "centimetres"], "centimetre"),
    **dict.fromkeys(["mm", "millimeter", "millimeters", "millimetres"], "millimetre"),
    **dict.fromkeys(["kg", "kgs", "kilo", "kilos", "kilograms"], "kilogram"),
    **dict.fromkeys(["g", "grams", "gramme", "grammes"], "gram"),
    **dict.fromkeys(["mg", "milligrams"], "milligram"),
    **dict.fromkeys(["ml", "milliliter", "milliliters", "millilitres"], "millilitre"),
    **dict.fromkeys(["l", "liter", "liters", "litres"], "litre"),
    **dict.fromkeys(["lb", "lbs", "pounds"], "pound"),
    **dict.fromkeys(["ft", "feet"], "foot"),
    **dict.fromkeys(["mi", "miles"], "mile"),
    **dict.fromkeys(["h", "hr", "hrs", "hours"], "hour"),
    **dict.fromkeys(["min", "mins", "minutes"], "minute"),
    **dict.fromkeys(["sec", "secs", "seconds"], "second"),
    **dict.fromkeys(["yr", "yrs", "years"], "year"),
    **dict.fromkeys(["kmh", "kph"], "kilometre"),
    **dict.fromkeys(["usd", "dollars"], "dollar"),
    **dict.fromkeys(["eur", "euros"], "euro"),
}

_IRREGULAR: Final[dict[str, str]] = {
    **dict.fromkeys(["won"], "win"),
    **dict.fromkeys(["held"], "hold"),
    **dict.fromkeys(["built"], "build"),
    **dict.fromkeys(["wrote", "written"], "write"),
    **dict.fromkeys(["began", "begun"], "begin"),
    **dict.fromkeys(["became"], "become"),
    **dict.fromkeys(["gave", "given"], "give"),
    **dict.fromkeys(["took", "taken"], "take"),
    **dict.fromkeys(["made"], "make"),
    **dict.fromkeys(["found"], "find"),
    **dict.fromkeys(["led"], "lead"),
    **dict.fromkeys(["sold"], "sell"),
    **dict.fromkeys(["bought"], "buy"),
    **dict.fromkeys(["taught"], "teach"),
    **dict.fromkeys(["thought"], "think"),
    **dict.fromkeys(["brought"], "bring"),
    **dict.fromkeys(["told"], "tell"),
    **dict.fromkeys(["said"], "say"),
    **dict.fromkeys(["paid"], "pay"),
    **dict.fromkeys(["ran"], "run"),
    **dict.fromkeys(["grew", "grown"], "grow"),
    **dict.fromkeys(["knew", "known"], "know"),
    **dict.fromkeys(["saw", "seen"], "see"),
    **dict.fromkeys(["went", "gone"], "go"),
    **dict.fromkeys(["came"], "come"),
    **dict.fromkeys(["got", "gotten"], "get"),
    **dict.fromkeys(["rose", "risen"], "rise"),
    **dict.fromkeys(["fell", "fallen"], "fall"),
    **dict.fromkeys(["drew", "drawn"], "draw"),
    **dict.fromkeys(["spoke", "spoken"], "speak"),
    **dict.fromkeys(["chose", "chosen"], "choose"),
    **dict.fromkeys(["broke", "broken"], "break"),
    **dict.fromkeys(["ate", "eaten"], "eat"),
    **dict.fromkeys(["flew", "flown"], "fly"),
    **dict.fromkeys(["drove", "driven"], "drive"),
    **dict.fromkeys(["met"], "meet"),
    **dict.fromkeys(["kept"], "keep"),
    **dict.fromkeys(["sent"], "send"),
    **dict.fromkeys(["spent"], "spend"),
    **dict.fromkeys(["lost"], "lose"),
    **dict.fromkeys(["meant"], "mean"),
    **dict.fromkeys(["felt"], "feel"),
    **dict.fromkeys(["stood"], "stand"),
    **dict.fromkeys(["understood"], "understand"),
    **dict.fromkeys(["fought"], "fight"),
    **dict.fromkeys(["caught"], "catch"),
    **dict.fromkeys(["sought"], "seek"),
    **dict.fromkeys(["struck"], "strike"),
    **dict.fromkeys(["wore", "worn"], "wear"),
    **dict.fromkeys(["hid", "hidden"], "hide"),
    **dict.fromkeys(["shot"], "shoot"),
    **dict.fromkeys(["sat"], "sit"),
    **dict.fromkeys(["slept"], "sleep"),
    **dict.fromkeys(["sang", "sung"], "sing"),
    **dict.fromkeys(["swam", "swum"], "swim"),
    **dict.fromkeys(["threw", "thrown"], "throw"),
    **dict.fromkeys(["laid"], "lay"),
    **dict.fromkeys(["dealt"], "deal"),
    **dict.fromkeys(["fled"], "flee"),
    **dict.fromkeys(["shown"], "show"),
    **dict.fromkeys(["children"], "child"),
    **dict.fromkeys(["men"], "man"),
    **dict.fromkeys(["women"], "woman"),
    **dict.fromkeys(["feet"], "foot"),
    **dict.fromkeys(["teeth"], "tooth"),
    **dict.fromkeys(["mice"], "mouse"),
    **dict.fromkeys(["people"], "person"),
}

# Very common English content words: they carry little of a statement's meaning, so missing ones cost less.
_GENERIC_WORDS: Final = (
    "make take get give go know see use find tell ask work seem feel try leave call keep let begin "
    "show hear play run move live believe hold bring happen write provide sit stand lose pay meet include "
    "continue set learn change lead understand follow stop create speak read allow add spend grow open "
    "offer remember consider appear wait serve send expect build stay fall reach remain suggest raise pass "
    "require report decide develop receive explain describe base help need mean become put say "
    "think look want start turn involve perform ensure contain support refer result occur exist "
    "list mention regard concern indicate represent associate identify establish "
    "determine produce achieve obtain apply form implement feature carry place "
    "thing way part kind type lot time example case fact point place area side end level order amount "
    "range variety manner aspect detail item instance sort piece deal "
    "new good high large big small important different various main major many several well often usually "
    "generally certain specific particular available current recent common general whole full total real "
    "possible likely early late long great little old young first last next best better less key overall "
    "known called located based able including regarding according "
    # nouns derived from the verbs above
    "explanation description information creation production inclusion provision requirement "
    "representation establishment determination identification association indication suggestion "
    "consideration description application performance development achievement"
).split()
