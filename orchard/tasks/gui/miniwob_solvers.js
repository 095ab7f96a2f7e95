// The oracle teacher's MiniWoB++ solvers (orchard/tasks/gui/oracle.py). Evaluated in the page with the
// task's name; returns the next action, {tool, args}, read from the live DOM (privileged: the teacher sees
// the page's structure, the policy only its screenshots), or null when nothing is left to do. Solvers are
// stateless: each turn they look at the page as it is now, so a detour or a slip does not derail them.
(name) => {
  const center = (el) => {
    const r = el.getBoundingClientRect();
    return {x: Math.round(r.left + r.width / 2), y: Math.round(r.top + r.height / 2)};
  };
  const click = (el) => (el ? {tool: 'click', args: center(el)} : null);
  const write = (el, text) => ({tool: 'write', args: {text: text, ...center(el), clear: true}});
  const fill = (el, text) => (el.value === text ? null : write(el, text));  // null: already filled
  const utterance = () => core.getUtterance();
  const quoted = () => Array.from(utterance().matchAll(/"([^"]*)"/g), (m) => m[1]);
  const all = (selector) => Array.from(document.querySelectorAll(selector));
  const byText = (selector, text) => all(selector).find((el) => el.textContent.trim() === text);
  const first = (...actions) => actions.find((action) => action !== null && action !== undefined) || null;

  const SOLVERS = {
    'click-button': () => click(byText('#area button', quoted()[0])),
    'click-link': () => click(byText('#area .alink', quoted()[0])),
    'click-test': () => click(document.querySelector('#subbtn')),
    'click-test-2': () => click(document.querySelector('#subbtn')),
    'focus-text': () => click(document.querySelector('#tt')),
    'enter-text': () => first(fill(document.querySelector('#tt'), quoted()[0]), click(document.querySelector('#subbtn'))),
    'login-user': () => {
      const [user, password] = quoted();
      return first(fill(document.querySelector('#username'), user), fill(document.querySelector('#password'), password),
                   click(document.querySelector('#subbtn')));
    },
  };
  const solver = SOLVERS[name];
  if (solver === undefined) throw new Error('the oracle has no solver for ' + name);
  return solver();
}
