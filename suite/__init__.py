"""suite: measured (and predicted) step time, memory, MFU, days and cost of pretraining recipes on GPU budgets."""
