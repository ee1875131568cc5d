"""What a run found and how it is told: verdicts, the failure report and its timeline, regression files, the
reproduction rate, search statistics, progress, and `check`'s result as data (JSON, JUnit)."""
