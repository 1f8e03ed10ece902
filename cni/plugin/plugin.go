package plugin

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/go-logr/logr"

	"github.com/trellis-net/trellis/cni/ipam"
	"github.com/trellis-net/trellis/cni/policyhook"
	"github.com/trellis-net/trellis/cni/veth"
	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/ipfamily"
)

// FaultEnv names a test-only fault point: when the plugin reaches it, it kills itself with
// SIGKILL, as a crash or an OOM kill would. Tests use it to prove ADD/DEL are crash-safe.
const FaultEnv = "TRELLIS_CNI_FAULT"

// Funcs are the plugin's commands for skel. ADD, DEL and CHECK report their outcome to
// the node agent (reported).
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{
		Add:    reported(cnicontract.CommandAdd, cmdAdd),
		Del:    reported(cnicontract.CommandDel, cmdDel),
		Check:  reported(cnicontract.CommandCheck, cmdCheck),
		Status: cmdStatus, GC: cmdGC,
	}
}

func fault(point string) {
	if os.Getenv(FaultEnv) == point {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL is not instantaneous
	}
}

// logger writes to the conflist's log file (stderr if it can't be opened), every line with
// the command and container ID. stdout carries only the result.
func logger(conf *NetConf, command, containerID string) (logr.Logger, func()) {
	var w io.Writer = os.Stderr
	closeFn := func() {}
	if conf != nil && conf.LogFile != "" {
		if err := os.MkdirAll(filepath.Dir(conf.LogFile), 0o750); err == nil {
			if f, err := os.OpenFile(conf.LogFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err == nil {
				w, closeFn = f, func() { f.Close() }
			}
		}
	}
	h := slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})
	return logr.FromSlogHandler(h).WithValues("cmd", command, "containerID", containerID), closeFn
}

func storeDir(conf *NetConf) string {
	return cnicontract.StoreDir(conf.DataDir, conf.Name)
}

func cmdAdd(args *skel.CmdArgs) (err error) {
	conf, cerr := parseConf(args.StdinData, true)
	if cerr != nil {
		return cerr
	}
	log, done := logger(conf, "ADD", args.ContainerID)
	defer done()
	defer func() {
		if err != nil {
			log.Error(err, "ADD failed")
		}
	}()
	k8s := K8sArgs{}
	if err := types.LoadArgs(args.Args, &k8s); err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_ARGS can't be parsed", err.Error())
	}
	podNS, err := openPodNetns(args.Netns)
	if err != nil {
		return err
	}
	defer podNS.Close()

	// The undo is armed before allocating: a failure after the first family's address
	// releases it too (Release frees every family).
	defer func() {
		if err != nil {
			if rerr := release(conf, args.ContainerID, args.IfName); rerr != nil {
				log.Error(rerr, "undo: releasing the addresses")
			}
		}
	}()
	ips, err := allocate(conf, args.ContainerID, args.IfName, string(k8s.K8S_POD_UID))
	if err != nil {
		return err
	}
	ip := ips[0] // the primary address: the first family of the conflist's (IPv4 when present)
	log = log.WithValues("ip", fmt.Sprint(ips))
	fault("add-after-ipam")

	hostName := veth.HostName(args.ContainerID, args.IfName)
	att, err := veth.Setup(podNS, hostName, args.IfName, ips, conf.MTU)
	if err != nil {
		return types.NewError(types.ErrInternal, "wiring the pod's interface", err.Error())
	}
	defer func() {
		if err != nil {
			if terr := veth.Teardown(hostName); terr != nil {
				log.Error(terr, "undo: removing the veth")
			}
		}
	}()
	fault("add-after-veth")

	if p := conf.Policy; p != nil {
		req := cnicontract.PolicyRequest{
			Op: cnicontract.PolicyOpAdd, ContainerID: args.ContainerID,
			Namespace: string(k8s.K8S_POD_NAMESPACE), Pod: string(k8s.K8S_POD_NAME), PodUID: string(k8s.K8S_POD_UID),
			IP: ip.String(), HostInterface: hostName,
		}
		if err := policyhook.Notify(p.Socket, conf.policyTimeout, req); err != nil {
			if p.FailurePolicy == cnicontract.FailurePolicyIgnore {
				log.Info("starting the pod without policy confirmation (policy.failurePolicy Ignore)", "reason", err.Error())
			} else {
				return types.NewError(types.ErrTryAgainLater, "the pod's network policies are not in place", err.Error())
			}
		}
	}
	fault("add-before-result")

	result := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: att.HostName, Mac: att.HostMAC.String()},
			{Name: att.PodName, Mac: att.PodMAC.String(), Sandbox: args.Netns},
		},
		DNS: conf.DNS,
	}
	// One address and one default route per family, in the order of ips (the runtime
	// takes the first address as the pod's primary IP).
	for _, ip := range ips {
		gw := veth.Gateway(ip)
		result.IPs = append(result.IPs, &current.IPConfig{Address: *veth.Prefix(ip), Gateway: gw, Interface: current.Int(1)})
		result.Routes = append(result.Routes, &types.Route{Dst: *veth.DefaultRoute(ip), GW: gw})
	}
	log.Info("pod wired", "hostInterface", hostName, "namespace", string(k8s.K8S_POD_NAMESPACE), "pod", string(k8s.K8S_POD_NAME))
	return types.PrintResult(result, conf.CNIVersion)
}

// allocate gives the attachment an address of each of the node's blocks, in their order,
// under one lock. On error the caller releases what was allocated.
func allocate(conf *NetConf, containerID, ifname, podUID string) ([]netip.Addr, error) {
	store, err := ipam.Open(storeDir(conf))
	if err != nil {
		return nil, types.NewError(types.ErrIOFailure, "opening the IPAM store", err.Error())
	}
	defer store.Close()
	var ips []netip.Addr
	for _, block := range conf.blocks {
		ip, err := store.Allocate(block, containerID, ifname, podUID)
		if errors.Is(err, ipam.ErrExhausted) {
			return nil, types.NewError(types.ErrTryAgainLater, fmt.Sprintf("the node's pod block %s is full", block), err.Error())
		}
		if err != nil {
			return nil, types.NewError(types.ErrIOFailure, "allocating an address", err.Error())
		}
		ips = append(ips, ip)
	}
	return ips, nil
}

func release(conf *NetConf, containerID, ifname string) error {
	store, err := ipam.Open(storeDir(conf))
	if err != nil {
		return err
	}
	defer store.Close()
	_, err = store.Release(containerID, ifname)
	return err
}

// cmdDel is idempotent and needs neither the netns nor prevResult: the runtime calls it at
// stop (with both) and again at removal (with neither), and after failed or killed ADDs.
func cmdDel(args *skel.CmdArgs) (err error) {
	conf, cerr := parseConf(args.StdinData, false)
	if cerr != nil {
		return cerr
	}
	log, done := logger(conf, "DEL", args.ContainerID)
	defer done()
	hostName := veth.HostName(args.ContainerID, args.IfName)
	if err := veth.Teardown(hostName); err != nil {
		log.Error(err, "DEL failed")
		return types.NewError(types.ErrInternal, "removing the pod's interface", err.Error())
	}
	fault("del-after-veth")
	store, err := ipam.Open(storeDir(conf))
	if err != nil {
		log.Error(err, "DEL failed")
		return types.NewError(types.ErrIOFailure, "opening the IPAM store", err.Error())
	}
	defer store.Close()
	freed, err := store.Release(args.ContainerID, args.IfName)
	if err != nil {
		log.Error(err, "DEL failed")
		return types.NewError(types.ErrIOFailure, "releasing the pod's address", err.Error())
	}
	log.Info("pod unwired", "hostInterface", hostName, "released", fmt.Sprint(freed))
	return nil
}

func cmdCheck(args *skel.CmdArgs) error {
	conf, cerr := parseConf(args.StdinData, true)
	if cerr != nil {
		return cerr
	}
	log, done := logger(conf, "CHECK", args.ContainerID)
	defer done()
	if conf.RawPrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "CHECK needs prevResult in the configuration", "")
	}
	if err := parsePrevResult(conf); err != nil {
		return types.NewError(types.ErrDecodingFailure, "prevResult can't be parsed", err.Error())
	}
	prev, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "prevResult can't be converted", err.Error())
	}
	want, err := expectedAttachment(prev, args, conf)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "prevResult does not describe a trellis attachment", err.Error())
	}
	store, err := ipam.Open(storeDir(conf))
	if err != nil {
		return types.NewError(types.ErrIOFailure, "opening the IPAM store", err.Error())
	}
	for _, ip := range want.IPs {
		held, ok, err := store.Get(ipfamily.Of(ip), args.ContainerID, args.IfName)
		if err != nil {
			store.Close()
			return types.NewError(types.ErrIOFailure, "reading the IPAM store", err.Error())
		}
		if !ok || held != ip {
			store.Close()
			return types.NewError(types.ErrInternal, fmt.Sprintf("IPAM: %s is not allocated to this attachment (it holds %v)", ip, held), "")
		}
	}
	store.Close()
	podNS, err := openPodNetns(args.Netns)
	if err != nil {
		return err
	}
	defer podNS.Close()
	if err := veth.Check(podNS, *want); err != nil {
		log.Error(err, "CHECK found differences")
		return types.NewError(types.ErrInternal, "the pod's network differs from prevResult", err.Error())
	}
	return nil
}

func parsePrevResult(conf *NetConf) error {
	return version.ParsePrevResult(&conf.PluginConf)
}

func expectedAttachment(prev *current.Result, args *skel.CmdArgs, conf *NetConf) (*veth.Attachment, error) {
	want := &veth.Attachment{HostName: veth.HostName(args.ContainerID, args.IfName), PodName: args.IfName, MTU: conf.MTU}
	for _, i := range prev.Interfaces {
		mac, _ := net.ParseMAC(i.Mac)
		switch {
		case i.Sandbox == "" && i.Name == want.HostName:
			want.HostMAC = mac
		case i.Sandbox != "" && i.Name == args.IfName:
			want.PodMAC = mac
		}
	}
	// One address per block of the conflist, of the block's family and inside it.
	for _, block := range conf.blocks {
		var found netip.Addr
		for _, c := range prev.IPs {
			if ip, ok := netip.AddrFromSlice(c.Address.IP); ok && block.Contains(ip.Unmap()) {
				found = ip.Unmap()
			}
		}
		if !found.IsValid() {
			return nil, fmt.Errorf("prevResult has no address of the pod block %s", block)
		}
		want.IPs = append(want.IPs, found)
	}
	if want.PodMAC == nil {
		return nil, fmt.Errorf("prevResult has no interface %s in a sandbox", args.IfName)
	}
	return want, nil
}

// cmdStatus reports whether the node can take new pods: the node agent creates the ready
// file once the node's datapath works.
func cmdStatus(args *skel.CmdArgs) error {
	conf, cerr := parseConf(args.StdinData, true)
	if cerr != nil {
		return cerr
	}
	if _, err := os.Stat(conf.ReadyFile); err != nil {
		return types.NewError(types.ErrPluginNotAvailable,
			"the trellis node agent has not marked this node's network ready",
			fmt.Sprintf("%s: %v; check the trellis-agent pod on this node", conf.ReadyFile, err))
	}
	if _, err := os.Stat(conf.DataDir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return types.NewError(types.ErrPluginNotAvailable, "the IPAM directory is unusable", err.Error())
	}
	return nil
}

// cmdGC releases every allocation, and removes every trellis host veth, that does not
// belong to an attachment in cni.dev/valid-attachments.
func cmdGC(args *skel.CmdArgs) error {
	conf, cerr := parseConf(args.StdinData, false)
	if cerr != nil {
		return cerr
	}
	log, done := logger(conf, "GC", "")
	defer done()
	validLinks := map[string]bool{}
	valid := map[[2]string]bool{}
	for _, a := range conf.ValidAttachments {
		valid[[2]string{a.ContainerID, a.IfName}] = true
		validLinks[veth.HostName(a.ContainerID, a.IfName)] = true
	}
	links, err := veth.HostLinks()
	if err != nil {
		return types.NewError(types.ErrInternal, "listing host veths", err.Error())
	}
	var errs []error
	for _, l := range links {
		if validLinks[l] {
			continue
		}
		if err := veth.Teardown(l); err != nil {
			errs = append(errs, err)
			continue
		}
		log.Info("removed stale host veth", "hostInterface", l)
	}
	store, err := ipam.Open(storeDir(conf))
	if err != nil {
		return types.NewError(types.ErrIOFailure, "opening the IPAM store", err.Error())
	}
	defer store.Close()
	freed, err := store.ReleaseExcept(func(id, ifname string) bool { return valid[[2]string{id, ifname}] })
	if err != nil {
		errs = append(errs, err)
	}
	for _, a := range freed {
		log.Info("released stale allocation", "ip", a.IP.String(), "owner", a.ContainerID, "ifname", a.IfName)
	}
	if err := errors.Join(errs...); err != nil {
		return types.NewError(types.ErrInternal, "garbage collection was incomplete", err.Error())
	}
	return nil
}
