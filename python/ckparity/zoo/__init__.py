"""ckparity zoo: does ckparity catch the bugs people actually ship, and how
much earlier than the way peers test? Scenarios of real bug classes
(zoo/scenarios.py), each planted through a public door (a backend of
zoo/bugs.py, registered as a user's plugin registers), run through
ckparity's tools and scored against the peers' criteria on the same runs
(zoo/run.py). docs/zoo.md has the table and how to add a scenario."""
