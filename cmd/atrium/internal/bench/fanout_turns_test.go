package bench

import (
	"fmt"
	"slices"
	"sync"
	"testing"
)

// TestTurns: three sides with different numbers of phases run them one at a
// time, round robin (a side that is done is skipped), none before all have
// joined, and none leaves finish before all are done; a side that quits
// before joining does not hold the others up.
func TestTurns(t *testing.T) {
	tr := newTurns(4)
	var mu sync.Mutex
	var log []string
	running := 0
	phases := []int{3, 1, 2}
	var wg sync.WaitGroup
	for i, n := range phases {
		wg.Go(func() {
			u := turn{t: tr, i: i}
			u.join()
			for p := range n {
				u.run(func() {
					mu.Lock()
					running++
					if running != 1 {
						t.Errorf("%d phases at once", running)
					}
					log = append(log, fmt.Sprintf("%d.%d", i, p))
					mu.Unlock()
					mu.Lock()
					running--
					mu.Unlock()
				})
			}
			u.finish()
			mu.Lock()
			log = append(log, fmt.Sprintf("%d.done", i))
			mu.Unlock()
			u.quit()
		})
	}
	turn{t: tr, i: 3}.quit() // the fourth side failed to open
	wg.Wait()
	want := []string{"0.0", "1.0", "2.0", "0.1", "2.1", "0.2"}
	if got := log[:len(want)]; !slices.Equal(got, want) {
		t.Fatalf("phases ran in order %v, want %v", got, want)
	}
	if len(log) != len(want)+3 {
		t.Fatalf("log %v", log)
	}
}
