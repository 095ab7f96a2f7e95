"""Task families: SWE, GUI and Claw (specs, sources, graders, synthetic generators)."""
