// etcd_mutex: acquire+release pairs/s through etcd's own Go lock,
// clientv3/concurrency.Mutex, for make bench-peers (bench/peers_numbers.sh).
// Each goroutine keeps one session (one etcd lease) and locks and unlocks
// keys of a shared key space in turn, for a fixed duration.
//
//	etcd_mutex -endpoints 127.0.0.1:23790 -goroutines 16 -keys 1000 -duration 5s
//
// Prints one line: "pairs N seconds S pairs_per_s R p50_us P p99_us Q".
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
)

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:2379", "etcd endpoints, comma-separated")
	goroutines := flag.Int("goroutines", 16, "concurrent lockers, one session each")
	keys := flag.Int("keys", 1000, "key space")
	duration := flag.Duration("duration", 5*time.Second, "how long to run")
	flag.Parse()
	if *goroutines < 1 || *keys < 1 || *duration <= 0 {
		fmt.Fprintln(os.Stderr, "etcd_mutex: -goroutines, -keys and -duration must be positive")
		os.Exit(2)
	}
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(*endpoints, ","),
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd_mutex: connect:", err)
		os.Exit(1)
	}
	defer client.Close()

	deadline := time.Now().Add(*duration)
	var mu sync.Mutex
	var latencies []time.Duration
	var failures int
	var wg sync.WaitGroup
	start := time.Now()
	for g := 0; g < *goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			session, err := concurrency.NewSession(client, concurrency.WithTTL(30))
			if err != nil {
				mu.Lock()
				failures++
				mu.Unlock()
				return
			}
			defer session.Close()
			var mine []time.Duration
			bad := 0
			for i := g; time.Now().Before(deadline); i += *goroutines {
				m := concurrency.NewMutex(session, fmt.Sprintf("/bench-peers/key-%d", i%*keys))
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				t0 := time.Now()
				if err := m.Lock(ctx); err != nil {
					bad++
					cancel()
					continue
				}
				if err := m.Unlock(ctx); err != nil {
					bad++
				}
				cancel()
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			latencies = append(latencies, mine...)
			failures += bad
			mu.Unlock()
		}(g)
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	if len(latencies) == 0 {
		fmt.Fprintf(os.Stderr, "etcd_mutex: no pair completed (%d failures)\n", failures)
		os.Exit(1)
	}
	sort.Slice(latencies, func(a, b int) bool { return latencies[a] < latencies[b] })
	pct := func(p float64) float64 {
		return float64(latencies[int(p*float64(len(latencies)-1))].Microseconds())
	}
	fmt.Printf("pairs %d seconds %.2f pairs_per_s %.1f p50_us %.0f p99_us %.0f failures %d\n",
		len(latencies), elapsed, float64(len(latencies))/elapsed, pct(0.50), pct(0.99), failures)
}
