"""The reference and the gate: the float64 ground truth, the error measures, gradients, faults the gate catches."""
