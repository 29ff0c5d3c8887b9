"""Is this build fixed? Wald's sequential probability ratio test on a run's time
at risk and its hangs (issue 36). Pure: numbers in, frozen records out; the live
view, the judge, the report and history all read the same decision, so the
package is a shared leaf (docs/ARCHITECTURE.md, floor 0)."""
