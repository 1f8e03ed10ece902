package metricsserving

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/endpoints/filters/impersonation"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// The cluster's client CA, as kube-apiserver publishes it for aggregated API servers (and
// the built-in Role kube-system/extension-apiserver-authentication-reader grants reading).
const (
	ClientCANamespace = "kube-system"
	ClientCAConfigMap = "extension-apiserver-authentication"
	ClientCAKey       = "client-ca-file"
)

// Delegated is the authentication and authorisation of a server that, like an aggregated
// API server, leaves both to the API server: a caller is whoever a bearer token says
// (TokenReview) or whoever a client certificate signed by the cluster's client CA says
// (the CA read from kube-system/extension-apiserver-authentication, reloaded when it
// changes), and may do what a SubjectAccessReview for the request's path and verb allows.
// Anonymous callers and certificates of any other CA get 401. It is what `kubectl` users
// have: a kubeconfig with a token or with a client certificate (kubeadm's admin.conf).
type Delegated struct {
	authn authenticator.Request
	authz authorizer.Authorizer
	ca    *dynamiccertificates.ConfigMapCAController
}

// retryBackoff is the API server's own default for its authentication/authorisation
// webhooks (k8s.io/apiserver/pkg/server/options.DefaultAuthWebhookRetryBackoff).
func retryBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
}

// NewDelegated builds the authenticator and authoriser with cfg's credentials (the
// server's own: it needs create on tokenreviews and subjectaccessreviews, and read of the
// client CA ConfigMap). Run must run for client certificates to be accepted.
func NewDelegated(cfg *rest.Config) (*Delegated, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("making a client for authentication: %w", err)
	}
	ca, err := dynamiccertificates.NewDynamicCAFromConfigMapController("client-ca", ClientCANamespace, ClientCAConfigMap, ClientCAKey, cs)
	if err != nil {
		return nil, fmt.Errorf("reading the client CA from %s/%s: %w", ClientCANamespace, ClientCAConfigMap, err)
	}
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		Anonymous:                          &apiserver.AnonymousAuthConfig{Enabled: false},
		CacheTTL:                           time.Minute,
		TokenAccessReviewClient:            cs.AuthenticationV1(),
		TokenAccessReviewTimeout:           10 * time.Second,
		WebhookRetryBackoff:                retryBackoff(),
		ClientCertificateCAContentProvider: ca,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("making the authenticator: %w", err)
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: cs.AuthorizationV1(),
		AllowCacheTTL:             time.Minute,
		DenyCacheTTL:              10 * time.Second,
		WebhookRetryBackoff:       retryBackoff(),
	}.New()
	if err != nil {
		return nil, fmt.Errorf("making the authoriser: %w", err)
	}
	return &Delegated{authn: authn, authz: authz, ca: ca}, nil
}

// Start keeps the client CA current until ctx ends (a manager.Runnable). Until the CA is
// read, client certificates are not accepted (401), tokens are.
func (d *Delegated) Start(ctx context.Context) error {
	d.ca.Run(ctx, 1)
	return nil
}

// Wrap puts authentication, impersonation (Impersonate-* headers, as `kubectl --as` sends
// them, allowed when the caller may impersonate: the API server's own filter) and
// authorisation in front of h. Failures are told apart so a client can say what is
// missing: 401 no or unknown credentials, 403 not allowed (the body names the user, verb
// and path), 500 the API server could not be asked.
func (d *Delegated) Wrap(log logr.Logger, h http.Handler) http.Handler {
	authorised := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		u, ok := request.UserFrom(req.Context())
		if !ok {
			http.Error(w, "no user", http.StatusInternalServerError)
			return
		}
		attrs := authorizer.AttributesRecord{User: u, Verb: strings.ToLower(req.Method), Path: req.URL.Path}
		decision, reason, err := d.authz.Authorize(req.Context(), attrs)
		if err != nil {
			log.Error(err, "authorisation failed", "user", u.GetName(), "path", req.URL.Path)
			http.Error(w, fmt.Sprintf("authorising user %q failed: %v", u.GetName(), err), http.StatusInternalServerError)
			return
		}
		if decision != authorizer.DecisionAllow {
			log.V(4).Info("forbidden", "user", u.GetName(), "path", req.URL.Path, "reason", reason)
			http.Error(w, fmt.Sprintf("Forbidden: user %q cannot %s non-resource URL %q (RBAC nonResourceURLs)", u.GetName(), attrs.Verb, req.URL.Path), http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, req)
	})
	impersonating := impersonation.WithImpersonation(authorised, d.authz, clientgoscheme.Codecs)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		res, ok, err := d.authn.AuthenticateRequest(req)
		if !ok {
			// A token the API server refused, a certificate of another CA and no
			// credentials at all: all mean "not authenticated" (err says which).
			log.V(4).Info("not authenticated", "err", fmt.Sprint(err))
			http.Error(w, "Unauthorized: present a bearer token or a client certificate the cluster's API server accepts", http.StatusUnauthorized)
			return
		}
		impersonating.ServeHTTP(w, req.WithContext(request.WithUser(req.Context(), res.User)))
	})
}

// DelegatedServer is Server with Delegated authentication (tokens and client
// certificates) and extra handlers behind it (controller-runtime wraps extra handlers in
// the same filter as /metrics). The returned Delegated must be started (mgr.Add) for
// client certificates to be accepted. When o is not Secure the extra handlers are not
// served at all: they never go out unauthenticated.
func (o Options) DelegatedServer(cfg *rest.Config, extra map[string]http.Handler) (metricsserver.Options, *Delegated, error) {
	s := o.Server()
	if !o.Secure || o.Addr == "0" {
		return s, nil, nil
	}
	d, err := NewDelegated(cfg)
	if err != nil {
		return s, nil, err
	}
	s.FilterProvider = func(*rest.Config, *http.Client) (metricsserver.Filter, error) {
		return func(log logr.Logger, h http.Handler) (http.Handler, error) { return d.Wrap(log, h), nil }, nil
	}
	s.ExtraHandlers = extra
	// Ask for a certificate without demanding one (token callers have none); the
	// authenticator verifies it against the cluster's client CA.
	s.TLSOpts = append(s.TLSOpts, func(c *tls.Config) { c.ClientAuth = tls.RequestClientCert })
	return s, d, nil
}
