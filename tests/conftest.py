"""Hypothesis profiles: `ci` (default, a few minutes in all) and `soak` (long, for release gating).

Select with HYPOTHESIS_PROFILE=soak.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("soak", deadline=None, max_examples=5000, stateful_step_count=120,
                          suppress_health_check=list(HealthCheck), print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=20)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
