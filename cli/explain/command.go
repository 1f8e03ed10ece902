package explain

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/trellis-net/trellis/cli"
)

// NewCommand is `kubectl trellis explain SOURCE DESTINATION`.
func NewCommand(f *cli.Factory) *cobra.Command {
	var port, protocol, family string
	cmd := &cobra.Command{
		Use:   "explain SOURCE DESTINATION",
		Short: "Which policies decide whether SOURCE may connect to DESTINATION, and the verdict",
		Long: `Explain judges the first packet of a connection from SOURCE to DESTINATION with the
rules the Trellis agents compile from the cluster's NetworkPolicies and
ClusterNetworkPolicies: the source's egress on its node, the destination's ingress on its
node. For each side it names the policies that isolate the pod, the rule that decides (or
that none allows) and the verdict. A Service is judged per endpoint.

SOURCE:      [pod/][NAMESPACE/]NAME, or an IP address
DESTINATION: [pod/][NAMESPACE/]NAME, svc/[NAMESPACE/]NAME or an IP address, each
             optionally followed by :PORT[/PROTOCOL] (PORT a number or a port name;
             an IPv6 address with a port is written [ADDR]:PORT)

The connection is of the family of the address given (IPv4 or IPv6); between pods named
on both ends it is IPv4 unless --ip-family ipv6 asks for their IPv6 addresses (dual-stack
clusters). Each family is judged by that family's rules (iptables or ip6tables).

The exit code is 0 whether the connection is allowed or denied; non-zero only when the
question can't be answered (an unknown pod, a missing port, the API server unreachable).`,
		Example: `  kubectl trellis explain -n shop web-0 db-0:5432
  kubectl trellis explain shop/web-0 svc/shop/db:postgres
  kubectl trellis explain shop/web-0 203.0.113.10:443/tcp -o json
  kubectl trellis explain 198.51.100.7 shop/web-0:http
  kubectl trellis explain shop/web-0 '[2001:db8::10]:443/tcp'
  kubectl trellis explain --ip-family ipv6 -n shop web-0 db-0:5432`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.ValidateOutput(); err != nil {
				return err
			}
			ns, _, err := f.Config.ToRawKubeConfigLoader().Namespace()
			if err != nil {
				return fmt.Errorf("reading the namespace from the kubeconfig: %w", err)
			}
			q, err := ParseQuery(args[0], args[1], port, protocol, ns)
			if err != nil {
				return err
			}
			if err := q.SetFamily(family); err != nil {
				return err
			}
			snap, err := Load(cmd.Context(), f)
			if err != nil {
				return err
			}
			res, err := snap.Explain(q)
			if err != nil {
				return err
			}
			if f.JSON() {
				enc := json.NewEncoder(f.Out)
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}
			Render(f.Out, res)
			return nil
		},
	}
	cmd.Flags().StringVar(&port, "port", "", "destination port: a number or a port name (or DESTINATION:PORT)")
	cmd.Flags().StringVar(&protocol, "protocol", "", "tcp (default), udp or sctp (or DESTINATION:PORT/PROTOCOL)")
	cmd.Flags().StringVar(&family, "ip-family", "", "ipv4 or ipv6: which of the pods' addresses a pod-to-pod or pod-to-Service connection uses (default: the family of an address given, else ipv4)")
	f.AddOutputFlag(cmd)
	return cmd
}
