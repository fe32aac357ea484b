// A real OpenID provider (npm `oidc-provider`) on 127.0.0.1 for the sign-in tests.
// Usage: node oidc_provider.mjs PORT CONFIG_JSON
// CONFIG_JSON: {"client_id", "client_secret", "redirect_uri", "post_logout_redirect_uri",
//               "accounts": {"<login>": {"email": ..., "name": ..., "groups": [...]}}}
// Its development login form takes any password for a login named in "accounts".
import Provider from 'oidc-provider';

const port = Number(process.argv[2]);
const config = JSON.parse(process.argv[3]);
const issuer = `http://127.0.0.1:${port}`;

const provider = new Provider(issuer, {
  clients: [{
    client_id: config.client_id,
    client_secret: config.client_secret,
    redirect_uris: [config.redirect_uri],
    post_logout_redirect_uris: [config.post_logout_redirect_uri],
    grant_types: ['authorization_code'],
    response_types: ['code'],
  }],
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'preferred_username'],
    groups: ['groups'],
  },
  async findAccount(_ctx, login) {
    const account = config.accounts[login];
    if (!account) return undefined;
    return {
      accountId: login,
      async claims() {
        return { sub: login, preferred_username: login, email_verified: true, ...account };
      },
    };
  },
  features: { devInteractions: { enabled: true }, rpInitiatedLogout: { enabled: true } },
  cookies: { keys: ['fairgate-test-only'] },
});
provider.proxy = false;

provider.listen(port, '127.0.0.1', () => {
  console.log(`ready ${issuer}`);
});
