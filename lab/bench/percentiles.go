package bench

import (
	"math"
	"slices"
)

// Percentiles are nearest-rank percentiles of N samples, in seconds: the
// one definition every figure of a bench uses.
type Percentiles struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
}

// PercentilesOf are the nearest-rank p50 and p90 of xs: the smallest sample
// with at least half (nine tenths) of the samples at or below it.
func PercentilesOf(xs []float64) Percentiles {
	if len(xs) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := func(p float64) float64 { return s[max(0, int(math.Ceil(p*float64(len(s))))-1)] }
	return Percentiles{N: len(s), P50: rank(0.5), P90: rank(0.9)}
}
