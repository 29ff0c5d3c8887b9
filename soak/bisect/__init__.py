"""Which build broke it? Bayesian bisection over an ordered list of builds
(issue 36): soak segments are evidence, a posterior over the first bad build
says where it stands, the next build to soak is the one expected to teach the
most. ``posterior`` is the pure core (segments in, posterior and choice out);
the command that runs segments through ``soak run`` sits above it, a floor over
the wiring (docs/ARCHITECTURE.md)."""
