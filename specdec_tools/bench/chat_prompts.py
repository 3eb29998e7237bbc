"""General chat prompts for load runs: everyday questions with nothing to copy.

The shipped bench set (specdec_tools.bench.prompts) mixes tasks, some of which (extraction,
summarisation, translation) hand the model text to repeat; a model-free look-up then
drafts well and flatters speculation. These are the kind a chat service mostly gets:
open questions whose answers the model writes from scratch. Written for this project,
fixed, and not tuned to any result; none of them is in the bench set.
"""

from __future__ import annotations

PROMPTS: list[tuple[str, str]] = [
    ("gift", "What is a thoughtful birthday gift for a friend who loves gardening?"),
    ("habit", "How can I build a habit of reading every day?"),
    ("interview", "Give me some advice for my first job interview next week."),
    ("tides", "Why does the ocean have tides?"),
    ("budget", "How should a student plan a monthly budget?"),
    ("dinner", "Suggest an easy vegetarian dinner I can cook in thirty minutes."),
    ("focus", "I keep getting distracted while studying. What can I do?"),
    ("volcano", "How do volcanoes form?"),
    ("trip", "What should I pack for a weekend hiking trip in the mountains?"),
    ("language", "What is the best way to start learning a new language as an adult?"),
    ("plants", "Why do the leaves of my houseplant turn yellow?"),
    ("email", "How do I write a polite email asking my manager for a day off?"),
    ("exercise", "What are the benefits of walking every day?"),
    ("moon", "Why do we always see the same side of the Moon?"),
    ("friend", "My friend seems sad lately. How can I support them?"),
    ("coffee", "Is it bad to drink coffee in the evening?"),
]
