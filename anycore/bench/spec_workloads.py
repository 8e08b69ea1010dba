"""The prompts of `anycore bench speculative`, written for this repository.

Three are input-grounded (the answer copies long spans of the prompt, where prompt lookup and
draft heads should win) and one is open chat (little to copy: speculation must back off and
cost next to nothing). Each is a single user turn, put through the model's chat template by the
benchmark.
"""

from __future__ import annotations

_CODE = '''\
def merge_intervals(intervals):
    """Merge overlapping [start, end] intervals and return them sorted."""
    if not intervals:
        return []
    ordered = sorted(intervals, key=lambda pair: pair[0])
    merged = [list(ordered[0])]
    for start, end in ordered[1:]:
        last = merged[-1]
        if start <= last[1]:
            last[1] = max(last[1], end)
        else:
            merged.append([start, end])
    return merged


def total_covered(intervals):
    """Length of the union of the intervals."""
    return sum(end - start for start, end in merge_intervals(intervals))


def gaps(intervals, lower, upper):
    """The parts of [lower, upper] that no interval covers."""
    result = []
    cursor = lower
    for start, end in merge_intervals(intervals):
        if start > cursor:
            result.append([cursor, min(start, upper)])
        cursor = max(cursor, end)
        if cursor >= upper:
            break
    if cursor < upper:
        result.append([cursor, upper])
    return result
'''

_TEXT = (
    "The lighthouse on the northern cape was built in 1871 from granite cut in a quarry two miles "
    "inland. Its first keeper, a retired ship's carpenter, kept a log of every vessel that passed, "
    "the direction of the wind at dawn and dusk, and the number of hours the lamp burned each night. "
    "In the winter of 1883 a storm broke three of the lantern's panes, and the keeper held a sheet of "
    "canvas over the gap until morning so that the light would not fail. The lamp was converted from "
    "oil to electricity in 1926, and the last keeper left in 1968, when the light was automated. "
    "Today the tower is a small museum: the log books sit in a glass case on the ground floor, and "
    "visitors can climb the one hundred and twelve steps to the gallery on summer afternoons."
)

_LIST = (
    "1. Monday: check the water filters and record the pressure readings.\n"
    "2. Tuesday: clean the intake screens and record the flow rate.\n"
    "3. Wednesday: test the backup pump and record the start-up time.\n"
    "4. Thursday: inspect the valves and record any leaks found.\n"
    "5. Friday: calibrate the sensors and record the calibration offsets.\n"
)

SPEC_WORKLOADS: dict[str, str] = {
    "edit": "```python\n" + _CODE + "```\n\nAdd type hints to these functions. Output the full code.",
    "quote": "Repeat the following passage exactly, word for word:\n\n" + _TEXT,
    "list": "Continue this list in the same format up to 10:\n\n" + _LIST,
    "chat": "What are some good ways to stay focused while studying for an exam?",
}
# the workloads where the answer is grounded in the prompt (the issue's >= 1.5x goal); chat is the
# open-ended control (never more than a few percent slower than no speculation)
INPUT_GROUNDED = ("edit", "quote", "list")
