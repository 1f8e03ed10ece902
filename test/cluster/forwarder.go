package cluster

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster/forward"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

// The loopback forwarder outlives Up, so it is a process of its own: the binary running
// Up (the localcluster command or a test binary, whichever imports this package) started
// again with daemonEnv set, which init turns into the forwarder before main (or the tests)
// would run. Its command line starts with forwarderArg0 and holds the state directory, so
// that Down can find it.
const (
	daemonEnv     = "TRELLIS_LOCALCLUSTER_DAEMON"
	forwarderArg0 = "trellis-localcluster-forwarder"
)

func init() {
	if os.Getenv(daemonEnv) == "forwarder" {
		os.Exit(runForwarder(os.Args[1:]))
	}
}

// runForwarder serves the listener inherited as fd 3 until SIGTERM, or until the
// control-plane namespace is gone (the cluster was removed without stopping it).
func runForwarder(args []string) int {
	fs := flag.NewFlagSet(forwarderArg0, flag.ContinueOnError)
	stateDir := fs.String("state-dir", "", "the cluster's state directory (identifies the process)")
	netns := fs.String("netns", "", "network namespace of the API server")
	target := fs.String("target", "", "address of the API server in that namespace")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log.SetPrefix(forwarderArg0 + ": ")
	l, err := net.FileListener(os.NewFile(3, "listener"))
	if err != nil {
		log.Printf("no listener on fd 3: %v", err)
		return 1
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	go func() {
		if check.Until(ctx, 5*time.Second, *netns+" gone", func(context.Context) error {
			if _, err := os.Stat(*netns); err == nil {
				return errors.New("still there")
			}
			return nil
		}) == nil {
			log.Printf("%s is gone: exiting", *netns)
			cancel()
		}
	}()
	log.Printf("forwarding %s to %s in %s for the cluster in %s", l.Addr(), *target, *netns, *stateDir)
	if err := forward.Serve(ctx, l, *netns, *target, log.Printf); err != nil {
		log.Print(err)
		return 1
	}
	return 0
}

// startForwarder starts the forwarder on a free loopback port and returns its pid and
// port. The listening socket is made here and inherited, so the port is known at once.
func startForwarder(stateDir, logPath, netnsPath, target string) (pid, port int, err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, 0, fmt.Errorf("listening on loopback: %w", err)
	}
	port = l.Addr().(*net.TCPAddr).Port
	f, err := l.(*net.TCPListener).File()
	l.Close() // the duplicate in f is what the child inherits
	if err != nil {
		return 0, 0, fmt.Errorf("passing the listener: %w", err)
	}
	defer f.Close()
	p, err := procs.Start(procs.Spec{
		Path:       "/proc/self/exe",
		Args:       []string{forwarderArg0, "--state-dir", stateDir, "--netns", netnsPath, "--target", target},
		Env:        []string{daemonEnv + "=forwarder"},
		Log:        logPath,
		ExtraFiles: []*os.File{f},
	})
	if err != nil {
		return 0, 0, fmt.Errorf("starting the forwarder: %w", err)
	}
	return p.Pid, port, nil
}

// forwarderAddr is the forwarder's loopback address.
func forwarderAddr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
