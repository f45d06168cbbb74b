"""How a run's results reach the reader: terminal summary now; GitHub, JUnit, HTML later."""
