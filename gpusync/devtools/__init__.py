"""Developer tools (the OpInfo differential, docs/rules.md's op table). No gpusync command
imports this package: it needs torch's internal test modules (and `expecttest`)."""
