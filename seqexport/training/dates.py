"""Date normalisation: one calendar date written many ways -> its ISO form "YYYY-MM-DD".

    "5 March 2021", "Mar 5, 21", "05/03/2021", "Friday, March 5th 2021" ... -> "2021-03-05"

Conventions (fixed, so that every input has exactly one answer):
- Numeric day/month formats are DAY-FIRST ("05/03/2021" is 5 March), as in most
  of the world; the only month-before-day numeric forms start with a four-digit
  year ("2021/03/05", "20210305").
- Years run 1950-2049. A two-digit year yy means 19yy for 50-99 and 20yy for
  00-49 ("Mar 5, 21" is 2021, "5.3.87" is 1987).
- A weekday, when written, is the true weekday of the date.

The held-out split: a date belongs to "test" when the SHA-256 of its ISO form
falls in one of TEST_BUCKETS of 100 buckets, else to "train". The two splits
never share a date, whatever the format or the seed.

Standard library only (no torch): the runtime and data tools import it.
"""

import datetime as dt
import hashlib
import random

FIRST = dt.date(1950, 1, 1)  # first date generated
LAST = dt.date(2049, 12, 31)  # last date generated
TEST_BUCKETS = 10  # of 100 hash buckets -> about 10% of all dates are held out
SPLITS = ("train", "test")

MONTHS = [
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
]  # fmt: skip
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def ordinal(n: int) -> str:
    """1 -> "1st", 2 -> "2nd", 11 -> "11th", 23 -> "23rd"."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _fields(d: dt.date) -> dict:
    return {
        "d": d.day,
        "dd": f"{d.day:02d}",
        "do": ordinal(d.day),
        "m": d.month,
        "mm": f"{d.month:02d}",
        "month": MONTHS[d.month - 1],
        "mon": MONTHS[d.month - 1][:3],
        "yyyy": f"{d.year:04d}",
        "yy": f"{d.year % 100:02d}",
        "weekday": WEEKDAYS[d.weekday()],
        "wkd": WEEKDAYS[d.weekday()][:3],
    }


# Format strings over the fields of `_fields`; numeric d/m forms are day-first.
FORMATS = (
    "{d} {month} {yyyy}",  # 5 March 2021
    "{dd} {month} {yyyy}",  # 05 March 2021
    "{d} {mon} {yy}",  # 5 Mar 21
    "{mon} {d}, {yy}",  # Mar 5, 21
    "{mon} {d}, {yyyy}",  # Mar 5, 2021
    "{mon}. {d}, {yyyy}",  # Mar. 5, 2021
    "{month} {d}, {yyyy}",  # March 5, 2021
    "{month} {d} {yyyy}",  # March 5 2021
    "{month} {do}, {yyyy}",  # March 5th, 2021
    "{dd}/{mm}/{yyyy}",  # 05/03/2021
    "{d}/{m}/{yy}",  # 5/3/21
    "{dd}/{mm}/{yy}",  # 05/03/21
    "{d}.{m}.{yyyy}",  # 5.3.2021
    "{dd}.{mm}.{yy}",  # 05.03.21
    "{d}-{m}-{yyyy}",  # 5-3-2021
    "{yyyy}/{mm}/{dd}",  # 2021/03/05
    "{yyyy}-{mm}-{dd}",  # 2021-03-05
    "{yyyy}.{m}.{d}",  # 2021.3.5
    "{yyyy}{mm}{dd}",  # 20210305
    "{dd}-{mon}-{yyyy}",  # 05-Mar-2021
    "{d}-{mon}-{yy}",  # 5-Mar-21
    "{weekday}, {month} {do} {yyyy}",  # Friday, March 5th 2021
    "{weekday}, {d} {month} {yyyy}",  # Friday, 5 March 2021
    "{wkd} {d} {mon} {yyyy}",  # Fri 5 Mar 2021
    "{wkd}, {dd}/{mm}/{yyyy}",  # Fri, 05/03/2021
    "{do} of {month}, {yyyy}",  # 5th of March, 2021
    "the {do} of {month} {yyyy}",  # the 5th of March 2021
    "{do} {month} {yy}",  # 5th March 21
)
CASES = ("as is", "as is", "lower", "upper")  # drawn uniformly: half keep the case


def format_date(date: dt.date, fmt: str, case: str = "as is") -> str:
    """Write `date` in format `fmt` (one of FORMATS), then apply `case` (one of CASES)."""
    text = fmt.format(**_fields(date))
    if case == "lower":
        return text.lower()
    if case == "upper":
        return text.upper()
    if case != "as is":
        raise ValueError(f"unknown case {case!r}; expected one of {sorted(set(CASES))}")
    return text


def split_of(date: dt.date) -> str:
    """"test" for the held-out dates (by a hash of the ISO form), else "train"."""
    bucket = int.from_bytes(hashlib.sha256(date.isoformat().encode()).digest()[:4], "big") % 100
    return "test" if bucket < TEST_BUCKETS else "train"


def make_split(split: str, n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n (input, "YYYY-MM-DD") pairs of the split's dates, in random formats.

    Deterministic in (split, n, seed); a larger n extends a smaller one.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    rng = random.Random(f"dates/{split}/{seed}")
    span = (LAST - FIRST).days
    pairs = []
    while len(pairs) < n:
        date = FIRST + dt.timedelta(days=rng.randint(0, span))
        fmt, case = rng.choice(FORMATS), rng.choice(CASES)
        if split_of(date) != split:
            continue
        pairs.append((format_date(date, fmt, case), date.isoformat()))
    return pairs
