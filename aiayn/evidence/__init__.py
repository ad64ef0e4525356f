"""The paper's claims, re-run at small scale: suites of runs (Table 3, the baselines), the report
rendered from their results, Table 1's costs measured."""
