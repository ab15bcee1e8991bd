"""Analysis over results: tables, figures, notebooks, comparisons of runs, targets, the results index."""
