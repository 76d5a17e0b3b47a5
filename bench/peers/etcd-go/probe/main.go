// A diagnostic probe for issue 42 (not part of the report): decomposes leader failovers on
// etcd into timestamps, for distlock's leader process (`distlock-bench --lead etcd ...`) or the
// Go peer's harness (`lead`). Per kill, in ms from the kill on this process's clock:
//
//   - the leader lease's expiry on the server at the kill, from LeaseTimeToLive polled every
//     2 ms (its TTL is whole seconds, truncated, so the instant it falls from 1 to 0 is the
//     expiry minus 1 s); the TTL minus that is how much of the lease was spent at the kill,
//     the time since the last keep-alive the server saw;
//   - the arrival of the DELETE event of the leader's key on a raw watch of its own client;
//   - the successor (a second leader process of the same kind, campaigning behind the first)
//     saying it leads.
//
// Built like the peer, offline from Debian's sources, and run from the workspace after a
// release build of the bench and bench/peers/install etcd-go:
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o /tmp/probe bench/peers/etcd-go/probe/main.go
//	/tmp/probe -kind distlock -n 8   # or: -kind go
//
// Only the leader's lease is polled, from a client of its own; etcd on 127.0.0.1:2379.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/mvcc/mvccpb"
)

var (
	kind    = flag.String("kind", "distlock", "distlock or go")
	bench   = flag.String("bench", "target/release/distlock-bench", "the distlock-bench binary")
	harness = flag.String("harness", "target/peers/etcd-go/harness", "the Go peer's harness")
	samples = flag.Int("n", 8, "kills")
	ttlMs   = flag.Int("ttl", 2000, "lease TTL, ms")
)

// A leader process of either kind; `leading` closes when it says it leads.
type proc struct {
	cmd     *exec.Cmd
	leading chan time.Time
}

func start(name, value string) (*proc, error) {
	var cmd *exec.Cmd
	var stdin *bufio.Writer
	if *kind == "distlock" {
		cmd = exec.Command(*bench, "--lead", "etcd", name, value, fmt.Sprint(*ttlMs))
	} else {
		cmd = exec.Command(*harness, "-endpoints", "127.0.0.1:2379")
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, leading: make(chan time.Time, 1)}
	lines := bufio.NewScanner(out)
	if *kind == "go" {
		if !lines.Scan() || !strings.Contains(lines.Text(), "hello") {
			return nil, fmt.Errorf("no hello from the harness: %q", lines.Text())
		}
		stdin = bufio.NewWriter(in)
		fmt.Fprintf(stdin, "lead %s %s %d\n", name, value, *ttlMs)
		stdin.Flush()
	}
	go func() {
		for lines.Scan() {
			t := lines.Text()
			if strings.HasPrefix(t, "leading ") || strings.Contains(t, `"ok"`) {
				p.leading <- time.Now()
				return
			}
			fmt.Fprintf(os.Stderr, "leader %s said %q\n", value, t)
		}
	}()
	return p, nil
}

func dir(name string) string {
	if *kind == "distlock" {
		return "/distlock/" + name + "/"
	}
	return "/" + name + "/"
}

func main() {
	flag.Parse()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	watcher, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	ttl := time.Duration(*ttlMs) * time.Millisecond
	var ages, expiryToDelete, deleteToLead, killToDelete, killToLead []float64
	for s := 0; s < *samples; s++ {
		name := fmt.Sprintf("probe-%d-%d", os.Getpid(), s)
		a, err := start(name, "A")
		if err != nil {
			panic(err)
		}
		<-a.leading
		// The leader's key and lease.
		resp, err := cli.Get(context.Background(), dir(name), clientv3.WithFirstCreate()...)
		if err != nil || len(resp.Kvs) == 0 {
			panic(fmt.Sprint("no leader key: ", err))
		}
		key, lease := string(resp.Kvs[0].Key), clientv3.LeaseID(resp.Kvs[0].Lease)
		wctx, wcancel := context.WithCancel(context.Background())
		wch := watcher.Watch(wctx, key, clientv3.WithRev(resp.Header.Revision+1))
		deleted := make(chan time.Time, 1)
		go func() {
			for wr := range wch {
				for _, ev := range wr.Events {
					if ev.Type == mvccpb.DELETE {
						deleted <- time.Now()
						return
					}
				}
			}
		}()
		// Poll the lease's TTL: the 1 -> 0 edge is expiry - 1 s; a 0 -> 1 edge is a renewal
		// seen while under 1 s left (rare with renewals every TTL/3).
		var mu sync.Mutex
		var edges []time.Time // each 1 -> 0 edge
		var lastTTL int64 = -1
		pctx, pcancel := context.WithCancel(context.Background())
		polled := make(chan struct{})
		go func() {
			defer close(polled)
			for pctx.Err() == nil {
				before := time.Now()
				r, err := cli.TimeToLive(pctx, lease)
				after := time.Now()
				if err == nil {
					mu.Lock()
					if lastTTL == 1 && r.TTL == 0 {
						edges = append(edges, before.Add(after.Sub(before)/2))
					}
					lastTTL = r.TTL
					mu.Unlock()
					if r.TTL < 0 {
						return
					}
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
		b, err := start(name, "B")
		if err != nil {
			panic(err)
		}
		// As the bench: 300 ms, then a random part of a third of the lease.
		time.Sleep(300*time.Millisecond + time.Duration(rand.Float64()*float64(ttl/3)))
		killed := time.Now()
		a.cmd.Process.Kill()
		del := <-deleted
		won := <-b.leading
		pcancel()
		<-polled
		wcancel()
		mu.Lock()
		var expiry time.Time
		if len(edges) > 0 {
			expiry = edges[len(edges)-1].Add(time.Second)
		}
		mu.Unlock()
		ms := func(t time.Time) float64 { return float64(t.Sub(killed).Microseconds()) / 1000 }
		age := float64(ttl.Milliseconds()) - ms(expiry)
		fmt.Printf("%s kill %2d: lease age at kill %6.0f ms | expiry %+6.0f | delete seen %+6.0f (expiry->delete %4.0f) | successor leads %+6.0f (delete->lead %4.0f)\n",
			*kind, s, age, ms(expiry), ms(del), ms(del)-ms(expiry), ms(won), ms(won)-ms(del))
		ages = append(ages, age)
		expiryToDelete = append(expiryToDelete, ms(del)-ms(expiry))
		deleteToLead = append(deleteToLead, ms(won)-ms(del))
		killToDelete = append(killToDelete, ms(del))
		killToLead = append(killToLead, ms(won))
		a.cmd.Wait()
		b.cmd.Process.Kill()
		b.cmd.Wait()
		cli.Revoke(context.Background(), lease)
	}
	med := func(v []float64) float64 {
		c := append([]float64(nil), v...)
		sort.Float64s(c)
		n := len(c)
		if n%2 == 1 {
			return c[n/2]
		}
		return (c[n/2-1] + c[n/2]) / 2
	}
	mean := func(v []float64) float64 {
		t := 0.0
		for _, x := range v {
			t += x
		}
		return t / float64(len(v))
	}
	fmt.Printf("%s over %d kills (median / mean, ms): lease age at kill %.0f / %.0f; expiry->delete %.0f / %.0f; kill->delete %.0f / %.0f; delete->successor leads %.0f / %.0f; kill->successor leads %.0f / %.0f\n",
		*kind, len(ages), med(ages), mean(ages), med(expiryToDelete), mean(expiryToDelete),
		med(killToDelete), mean(killToDelete), med(deleteToLead), mean(deleteToLead), med(killToLead), mean(killToLead))
}
