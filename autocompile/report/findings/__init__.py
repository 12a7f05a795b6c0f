"""What the study found, as the report reads it: measured entries and the search's matched-pair effects."""
