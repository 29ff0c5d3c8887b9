"""The correctness oracle: were the server's answers right?

A pure leaf. Greedy canary answers (temperature 0, a fixed seed, with logprobs
and top alternatives) are compared with a reference answer, and every
divergence is judged by the server's own logprobs at the first differing
position (``soak.oracle.compare``). ``answer`` holds the records and their
readers of vLLM's logprob formats; ``reference`` the reference file a known-good
build records and later nights read; ``rates`` the near-tie rule's derived
false-alarm rate. The canary probe that sends and judges them is
``soak.probes.canary``; the detector's ``corruption`` rule decides on its samples.
"""
