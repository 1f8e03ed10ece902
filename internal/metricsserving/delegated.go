package metricsserving

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/group"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/request/union"
	"k8s.io/apiserver/pkg/authentication/request/x509"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/endpoints/filters/impersonation"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/apiserver/pkg/util/webhook"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	authnv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
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
// API server, leaves both to the API server: a caller is whoever a bearer token issued for
// Audience says (TokenReview naming Audience, within Limits) or, when client certificates
// are on, whoever a client certificate signed by the cluster's client CA says (the CA read
// from kube-system/extension-apiserver-authentication, reloaded when it changes), and may
// do what a SubjectAccessReview for the request's path and verb allows. Anonymous callers,
// tokens for another audience and certificates of any other CA get 401; an unseen token
// over the review budget gets 429. It is what Prometheus has (a projected service-account
// token with Audience) and what `kubectl` users with a client certificate (kubeadm's
// admin.conf) have.
type Delegated struct {
	authn  authenticator.Request
	tokens *boundedTokens
	authz  authorizer.Authorizer
	ca     *dynamiccertificates.ConfigMapCAController
}

// retryBackoff is the API server's own default for its authentication/authorisation
// webhooks (k8s.io/apiserver/pkg/server/options.DefaultAuthWebhookRetryBackoff).
func retryBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
}

// NewDelegated builds the authenticator and authoriser with cfg's credentials (the
// server's own: it needs create on tokenreviews and subjectaccessreviews, and, with
// clientCerts, read of the client CA ConfigMap). Run must run for client certificates to
// be accepted.
func NewDelegated(cfg *rest.Config, clientCerts bool, limits Limits) (*Delegated, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("making a client for authentication: %w", err)
	}
	d := &Delegated{tokens: newBoundedTokens(&tokenReviewer{client: cs.AuthenticationV1().TokenReviews(), timeout: 10 * time.Second}, limits)}
	var authns []authenticator.Request
	if clientCerts {
		d.ca, err = dynamiccertificates.NewDynamicCAFromConfigMapController("client-ca", ClientCANamespace, ClientCAConfigMap, ClientCAKey, cs)
		if err != nil {
			return nil, fmt.Errorf("reading the client CA from %s/%s: %w", ClientCANamespace, ClientCAConfigMap, err)
		}
		authns = append(authns, x509.NewDynamic(d.ca.VerifyOptions, x509.CommonNameUserConversion))
	}
	authns = append(authns, bearertoken.New(d.tokens))
	d.authn = group.NewAuthenticatedGroupAdder(union.New(authns...))
	d.authz, err = authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: cs.AuthorizationV1(),
		AllowCacheTTL:             time.Minute,
		DenyCacheTTL:              10 * time.Second,
		WebhookRetryBackoff:       retryBackoff(),
	}.New()
	if err != nil {
		return nil, fmt.Errorf("making the authoriser: %w", err)
	}
	return d, nil
}

// tokenReviewer asks the API server who a token is, for Audience only.
type tokenReviewer struct {
	client  authnv1client.TokenReviewInterface
	timeout time.Duration
}

// AuthenticateToken implements authenticator.Token: a refusal is (nil, false, nil) (the
// caller caches it), an error means the API server didn't answer (not cached).
func (r *tokenReviewer) AuthenticateToken(ctx context.Context, token string) (*authenticator.Response, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	review := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{Audience}}}
	var result *authenticationv1.TokenReview
	if err := webhook.WithExponentialBackoff(ctx, *retryBackoff(), func() error {
		var err error
		result, err = r.client.Create(ctx, review, metav1.CreateOptions{})
		return err
	}, webhook.DefaultShouldRetry); err != nil {
		return nil, false, fmt.Errorf("asking for a TokenReview: %w", err)
	}
	// The API server answers with the audiences the token is valid for among those asked:
	// none (an authenticator that ignores audiences) is not good enough.
	if !result.Status.Authenticated || !slices.Contains(result.Status.Audiences, Audience) {
		return nil, false, nil
	}
	u := result.Status.User
	var extra map[string][]string
	if u.Extra != nil {
		extra = make(map[string][]string, len(u.Extra))
		for k, v := range u.Extra {
			extra[k] = v
		}
	}
	return &authenticator.Response{User: &user.DefaultInfo{Name: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra},
		Audiences: authenticator.Audiences{Audience}}, true, nil
}

// Start keeps the client CA current until ctx ends (a manager.Runnable). Until the CA is
// read, client certificates are not accepted (401), tokens are.
func (d *Delegated) Start(ctx context.Context) error {
	if d.ca != nil {
		d.ca.Run(ctx, 1)
	}
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
		res, ok, err := d.authn.AuthenticateRequest(req.WithContext(withSource(req.Context(), req.RemoteAddr)))
		if !ok {
			if errors.Is(err, errLimited) {
				// Not refused, not reviewed: an unseen token over the review budget.
				w.Header().Set("Retry-After", "1")
				http.Error(w, "Too Many Requests: too many unknown bearer tokens to review now; try again later", http.StatusTooManyRequests)
				return
			}
			// A token the API server refused or that is not for Audience, a certificate
			// of another CA and no credentials at all: all mean "not authenticated" (err
			// says which).
			log.V(4).Info("not authenticated", "err", fmt.Sprint(err))
			http.Error(w, "Unauthorized: present a bearer token issued for the audience "+Audience+" (a projected service-account token) or a client certificate the cluster's API server accepts", http.StatusUnauthorized)
			return
		}
		impersonating.ServeHTTP(w, req.WithContext(request.WithUser(req.Context(), res.User)))
	})
}

// DelegatedServer is Server with Delegated authentication (tokens for Audience and client
// certificates) and extra handlers behind it (controller-runtime wraps extra handlers in
// the same filter as /metrics). The returned Delegated must be started (mgr.Add) for
// client certificates to be accepted. When o is not Secure the extra handlers are not
// served at all: they never go out unauthenticated.
func (o Options) DelegatedServer(cfg *rest.Config, extra map[string]http.Handler) (metricsserver.Options, *Delegated, error) {
	return o.delegated(cfg, true, extra)
}

// TokenServer is Server with Delegated authentication by bearer tokens for Audience only
// (no client certificates: the server needs no read of the client CA). Nothing needs
// starting.
func (o Options) TokenServer(cfg *rest.Config) (metricsserver.Options, error) {
	s, _, err := o.delegated(cfg, false, nil)
	return s, err
}

func (o Options) delegated(cfg *rest.Config, clientCerts bool, extra map[string]http.Handler) (metricsserver.Options, *Delegated, error) {
	s := o.server()
	if !o.Secure || o.Addr == "0" {
		return s, nil, nil
	}
	limits := o.Limits
	if limits == (Limits{}) {
		limits = DefaultLimits()
	}
	d, err := NewDelegated(cfg, clientCerts, limits)
	if err != nil {
		return s, nil, err
	}
	s.FilterProvider = func(*rest.Config, *http.Client) (metricsserver.Filter, error) {
		return func(log logr.Logger, h http.Handler) (http.Handler, error) { return d.Wrap(log, h), nil }, nil
	}
	s.ExtraHandlers = extra
	if clientCerts {
		// Ask for a certificate without demanding one (token callers have none); the
		// authenticator verifies it against the cluster's client CA.
		s.TLSOpts = append(s.TLSOpts, func(c *tls.Config) { c.ClientAuth = tls.RequestClientCert })
	}
	return s, d, nil
}
