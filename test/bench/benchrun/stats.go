package benchrun

import (
	"math"
	"slices"
	"time"
)

// Percentile is the nearest-rank percentile (p in (0,100]) of samples: with 20 samples p99
// is the largest, so a tail is never averaged away. ok is false without samples.
func Percentile(samples []time.Duration, p float64) (d time.Duration, ok bool) {
	if len(samples) == 0 {
		return 0, false
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[max(rank, 1)-1], true
}
