// The etcd peer of distlock-bench: etcd's own Go lock, concurrency.Mutex, driven by the bench
// over stdin/stdout (the protocol is in bench/peers/README.md). It measures and prints raw
// numbers only; the bench computes every statistic itself.
//
// Built offline from Debian's sources (golang-etcd-server-dev) in GOPATH mode:
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o target/peers/etcd-go/harness main.go
//
// Every contender is a goroutine with its own clientv3.Client and its own concurrency.Session
// (lease), as separate processes would have.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
	"go.etcd.io/etcd/version"
)

var endpoints = flag.String("endpoints", "127.0.0.1:2379", "etcd endpoints, host:port[,host:port...]")

// One contender: a client, its session and the mutex on the name it contends for.
type contender struct {
	client  *clientv3.Client
	session *concurrency.Session
}

func connect() (*contender, error) {
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(*endpoints, ","),
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	session, err := concurrency.NewSession(client)
	if err != nil {
		client.Close()
		return nil, err
	}
	return &contender{client: client, session: session}, nil
}

func (c *contender) close() {
	c.session.Close()
	c.client.Close()
}

func (c *contender) mutex(name string) *concurrency.Mutex {
	return concurrency.NewMutex(c.session, "/"+name)
}

func connectN(n int) ([]*contender, error) {
	out := make([]*contender, 0, n)
	for i := 0; i < n; i++ {
		c, err := connect()
		if err != nil {
			for _, o := range out {
				o.close()
			}
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

var stdout = bufio.NewWriter(os.Stdout)

func reply(v interface{}) {
	line, err := json.Marshal(v)
	if err != nil {
		line, _ = json.Marshal(map[string]string{"error": err.Error()})
	}
	stdout.Write(line)
	stdout.WriteByte('\n')
	stdout.Flush()
}

// The cycle's client and mutexes, kept across cycle commands so that every slice runs warm,
// as an application's long-lived client does.
var (
	cycleClient  *contender
	cycleMutexes = map[string]*concurrency.Mutex{}
)

// cycle: one client, lock + unlock on one free name, for `d`.
func cycle(name string, d time.Duration) (interface{}, error) {
	if cycleClient == nil {
		c, err := connect()
		if err != nil {
			return nil, err
		}
		cycleClient = c
	}
	m, ok := cycleMutexes[name]
	if !ok {
		m = cycleClient.mutex(name)
		cycleMutexes[name] = m
	}
	ctx := context.Background()
	ns := []int64{}
	end := time.Now().Add(d)
	for {
		t := time.Now()
		if err := m.Lock(ctx); err != nil {
			return nil, err
		}
		if err := m.Unlock(ctx); err != nil {
			return nil, err
		}
		now := time.Now()
		ns = append(ns, int64(now.Sub(t)))
		if !now.Before(end) {
			break
		}
	}
	return map[string]interface{}{"cycle": map[string]interface{}{"ns": ns}}, nil
}

// The hand-off record the contenders share: when the last holder called unlock, and who it was.
type handoff struct {
	mu       sync.Mutex
	released time.Time
	releaser int
	valid    bool
	ns       []int64
	self     int64
}

// hot: `n` contenders on one name, each unlocking as soon as it holds the lock, for `d`.
func hot(name string, n int, d time.Duration) (interface{}, error) {
	cs, err := connectN(n)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, c := range cs {
			c.close()
		}
	}()
	var (
		stop       atomic.Bool
		holders    atomic.Int64
		violations atomic.Int64
		h          handoff
		wg         sync.WaitGroup
		start      = make(chan struct{})
	)
	grants := make([]int64, n)
	waits := make([][]int64, n)
	errs := make([]error, n)
	for i, c := range cs {
		wg.Add(1)
		go func(i int, c *contender) {
			defer wg.Done()
			m := c.mutex(name)
			ctx := context.Background()
			<-start
			for !stop.Load() {
				asked := time.Now()
				if err := m.Lock(ctx); err != nil {
					errs[i] = err
					return
				}
				granted := time.Now()
				if holders.Add(1) != 1 {
					violations.Add(1)
				}
				grants[i]++
				waits[i] = append(waits[i], int64(granted.Sub(asked)))
				h.mu.Lock()
				if h.valid {
					h.ns = append(h.ns, int64(granted.Sub(h.released)))
					if h.releaser == i {
						h.self++
					}
					h.valid = false
				}
				h.mu.Unlock()
				holders.Add(-1)
				h.mu.Lock()
				h.released, h.releaser, h.valid = time.Now(), i, true
				h.mu.Unlock()
				if err := m.Unlock(ctx); err != nil {
					errs[i] = err
					return
				}
			}
		}(i, c)
	}
	began := time.Now()
	close(start)
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(began)
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	var wait []int64
	for _, w := range waits {
		wait = append(wait, w...)
	}
	return map[string]interface{}{"hot": map[string]interface{}{
		"grants":        grants,
		"handoff_ns":    h.ns,
		"wait_ns":       wait,
		"self_regrants": h.self,
		"violations":    violations.Load(),
		"elapsed_ns":    int64(elapsed),
	}}, nil
}

// wake: a holder and a waiter (two clients); the waiter has waited a random time in [lo, hi]
// when the holder unlocks; the time from the unlock call to the waiter holding the lock.
func wake(prefix string, samples int, lo, hi time.Duration) (interface{}, error) {
	cs, err := connectN(2)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, c := range cs {
			c.close()
		}
	}()
	holder, waiter := cs[0], cs[1]
	ctx := context.Background()
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	ns := []int64{}
	for s := 0; s < samples; s++ {
		name := fmt.Sprintf("%s-%d", prefix, s)
		hm := holder.mutex(name)
		if err := hm.Lock(ctx); err != nil {
			return nil, err
		}
		type grant struct {
			at  time.Time
			err error
		}
		done := make(chan grant, 1)
		go func() {
			wm := waiter.mutex(name)
			if err := wm.Lock(ctx); err != nil {
				done <- grant{err: err}
				return
			}
			at := time.Now()
			done <- grant{at: at, err: wm.Unlock(ctx)}
		}()
		time.Sleep(lo + time.Duration(rng.Int63n(int64(hi-lo)+1)))
		select {
		case <-done:
			return nil, fmt.Errorf("%s: the waiter got the lock while it was held", name)
		default:
		}
		released := time.Now()
		if err := hm.Unlock(ctx); err != nil {
			return nil, err
		}
		g := <-done
		if g.err != nil {
			return nil, g.err
		}
		ns = append(ns, int64(g.at.Sub(released)))
	}
	return map[string]interface{}{"wake": map[string]interface{}{"ns": ns}}, nil
}

func millis(s string) (time.Duration, error) {
	v, err := strconv.ParseInt(s, 10, 64)
	return time.Duration(v) * time.Millisecond, err
}

// The election this process campaigns in (`lead` or `follow`), on a session with a short TTL,
// and an observer on a client of its own.
var (
	campaignClient *clientv3.Client
	campaignCancel context.CancelFunc
	campaignErr    = make(chan error, 1)
	election       *concurrency.Election
	observer       *contender
	observed       <-chan clientv3.GetResponse
)

// campaign starts campaigning for `name` as `value` on a session of `ttl` seconds; the
// returned channel closes when this process leads.
func campaign(name, value string, ttl int) (<-chan struct{}, error) {
	if campaignClient != nil {
		return nil, fmt.Errorf("this harness already campaigns")
	}
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(*endpoints, ","),
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	session, err := concurrency.NewSession(client, concurrency.WithTTL(ttl))
	if err != nil {
		client.Close()
		return nil, err
	}
	campaignClient = client
	election = concurrency.NewElection(session, "/"+name)
	ctx, cancel := context.WithCancel(context.Background())
	campaignCancel = cancel
	leading := make(chan struct{})
	go func() {
		if err := election.Campaign(ctx, value); err != nil {
			campaignErr <- err
			return
		}
		close(leading)
	}()
	return leading, nil
}

func ttlSecs(s string) (int, error) {
	ms, err := strconv.Atoi(s)
	if err != nil || ms < 1000 {
		return 0, fmt.Errorf("bad TTL %q (whole seconds, at least 1000 ms)", s)
	}
	return (ms + 999) / 1000, nil
}

// lead: campaign and answer once leading; the process then holds leadership until killed.
func lead(name, value, ttl string) (interface{}, error) {
	secs, err := ttlSecs(ttl)
	if err != nil {
		return nil, err
	}
	leading, err := campaign(name, value, secs)
	if err != nil {
		return nil, err
	}
	select {
	case <-leading:
		return map[string]interface{}{"ok": map[string]string{}}, nil
	case err := <-campaignErr:
		return nil, err
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("%s: not leading within 30 s", name)
	}
}

// follow: campaign in the background and observe the election from another client.
func follow(name, value, ttl string) (interface{}, error) {
	secs, err := ttlSecs(ttl)
	if err != nil {
		return nil, err
	}
	c, err := connect()
	if err != nil {
		return nil, err
	}
	observer = c
	observed = concurrency.NewElection(c.session, "/"+name).Observe(context.Background())
	if _, err := campaign(name, value, secs); err != nil {
		return nil, err
	}
	return map[string]interface{}{"ok": map[string]string{}}, nil
}

// observe: answer when the observer sees `value` lead.
func observe(value string) (interface{}, error) {
	if observed == nil {
		return nil, fmt.Errorf("observe before follow")
	}
	timeout := time.After(60 * time.Second)
	for {
		select {
		case resp, ok := <-observed:
			if !ok {
				return nil, fmt.Errorf("the observer stopped")
			}
			if len(resp.Kvs) > 0 && string(resp.Kvs[0].Value) == value {
				return map[string]interface{}{"ok": map[string]string{}}, nil
			}
		case err := <-campaignErr:
			return nil, err
		case <-timeout:
			return nil, fmt.Errorf("%s not seen leading within 60 s", value)
		}
	}
}

func resign() (interface{}, error) {
	if election != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		election.Resign(ctx)
		campaignCancel()
		campaignClient.Close()
		election, campaignClient = nil, nil
	}
	if observer != nil {
		observer.close()
		observer, observed = nil, nil
	}
	return map[string]interface{}{"ok": map[string]string{}}, nil
}

func run(words []string) (interface{}, error) {
	bad := fmt.Errorf("bad command %q", strings.Join(words, " "))
	switch {
	case len(words) == 3 && words[0] == "cycle":
		d, err := millis(words[2])
		if err != nil {
			return nil, bad
		}
		return cycle(words[1], d)
	case len(words) == 4 && words[0] == "hot":
		n, err1 := strconv.Atoi(words[2])
		d, err2 := millis(words[3])
		if err1 != nil || err2 != nil || n < 1 {
			return nil, bad
		}
		return hot(words[1], n, d)
	case len(words) == 5 && words[0] == "wake":
		samples, err1 := strconv.Atoi(words[2])
		lo, err2 := millis(words[3])
		hi, err3 := millis(words[4])
		if err1 != nil || err2 != nil || err3 != nil || hi < lo {
			return nil, bad
		}
		return wake(words[1], samples, lo, hi)
	case len(words) == 4 && words[0] == "lead":
		return lead(words[1], words[2], words[3])
	case len(words) == 4 && words[0] == "follow":
		return follow(words[1], words[2], words[3])
	case len(words) == 2 && words[0] == "observe":
		return observe(words[1])
	case len(words) == 1 && words[0] == "resign":
		return resign()
	}
	return nil, bad
}

func main() {
	flag.Parse()
	// Connecting once proves the server answers before the bench sends any work.
	c, err := connect()
	if err != nil {
		reply(map[string]string{"error": "cannot connect to etcd at " + *endpoints + ": " + err.Error()})
		os.Exit(1)
	}
	c.close()
	reply(map[string]interface{}{"hello": map[string]string{
		"library":    "etcd clientv3/concurrency.Mutex",
		"version":    version.Version,
		"runtime":    "Go " + strings.TrimPrefix(runtime.Version(), "go"),
		"contenders": "goroutines, one clientv3.Client and session (lease) each",
	}})
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		words := strings.Fields(in.Text())
		if len(words) == 0 {
			continue
		}
		if words[0] == "quit" {
			return
		}
		out, err := run(words)
		if err != nil {
			reply(map[string]string{"error": err.Error()})
			continue
		}
		reply(out)
	}
}
