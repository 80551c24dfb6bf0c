"""The model's entities and pure maths: requests, the clock, the step-time law, random streams."""
