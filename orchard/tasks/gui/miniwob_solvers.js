// The oracle teacher's MiniWoB++ solvers (orchard/tasks/gui/oracle.py). Evaluated in the page with the
// task's name; returns the next action, {tool, args}, read from the live DOM (privileged: the teacher sees
// the page's structure, the policy only its screenshots), or null when nothing is left to do. Solvers are
// stateless: each turn they look at the page as it is now, so a detour or a slip does not derail them.
// They read the DOM and the page's globals, but act only through the policy's tools.
(name) => {
  const WIDTH = window.innerWidth, HEIGHT = window.innerHeight;  // the 160x210 viewport

  // -- where to act: a point of the element that is on screen and not covered by another element
  const center = (el) => {
    const r = el.getBoundingClientRect();
    return {x: Math.round(r.left + r.width / 2), y: Math.round(r.top + r.height / 2)};
  };
  const hits = (el, x, y) => {
    const top = document.elementFromPoint(x, y);
    return top !== null && (top === el || el.contains(top));
  };
  const point = (el) => {  // the centre if it hits the element, else the first point of a grid over it that does
    const c = center(el);
    if (hits(el, c.x, c.y)) return c;
    const r = el.getBoundingClientRect();
    for (let fy = 0.5; fy > 0; fy -= 0.1) {
      for (const y of [r.top + r.height * fy, r.top + r.height * (1 - fy)]) {
        for (let fx = 0.5; fx > 0; fx -= 0.1) {
          for (const x of [r.left + r.width * fx, r.left + r.width * (1 - fx)]) {
            if (hits(el, Math.round(x), Math.round(y))) return {x: Math.round(x), y: Math.round(y)};
          }
        }
      }
    }
    return c;
  };
  const shown = (el) => el !== null && el !== undefined && el.getClientRects().length > 0;
  const onScreen = (el) => {
    const c = center(el);
    return c.x >= 0 && c.x < WIDTH && c.y >= 0 && c.y < HEIGHT;
  };
  // A wheel scroll of the page that brings el's centre to the middle of the viewport.
  const scrollTo = (el) => {
    const c = center(el), x = Math.round(WIDTH / 2), y = Math.round(HEIGHT / 2);
    return {tool: 'scroll', args: {x: x, y: y, delta_x: c.x - x, delta_y: c.y - y}};
  };

  // -- actions
  const click = (el) => (el ? (onScreen(el) ? {tool: 'click', args: point(el)} : scrollTo(el)) : null);
  const hover = (el) => (onScreen(el) ? {tool: 'hover', args: point(el)} : scrollTo(el));
  const write = (el, text) => ({tool: 'write', args: {text: text, ...point(el), clear: true}});
  const fill = (el, text) => (el.value === text ? null : write(el, text));  // null: already filled
  const press = (...keys) => ({tool: 'press_keys', args: {keys: keys.join(' ')}});
  const wait = (seconds = 0.5) => ({tool: 'wait', args: {seconds: seconds}});
  // Date and time fields type into the part under the click: click dx pixels into the field, then type.
  const writeAt = (el, text, dx) => {
    const r = el.getBoundingClientRect();
    return {tool: 'write', args: {text: text, x: Math.round(r.left + dx), y: Math.round(r.top + r.height / 2)}};
  };
  // A wheel scroll over a scrolling element (a text area) down to its end; null when it is there.
  const scrollDown = (el) => {
    const rest = el.scrollHeight - el.scrollTop - el.clientHeight;
    return rest > 2 ? {tool: 'scroll', args: {...center(el), delta_y: Math.ceil(rest)}} : null;
  };
  // jQuery UI animates accordions, dialogs and menus: wait until the page is still before reading it.
  const animating = () => typeof $ !== 'undefined' && $(':animated').length > 0;

  // -- reading the page
  const utterance = () => core.getUtterance();
  const quoted = () => Array.from(utterance().matchAll(/"([^"]*)"/g), (m) => m[1]);
  const all = (selector, root = document) => Array.from(root.querySelectorAll(selector));
  const byText = (selector, text) => all(selector).find((el) => el.textContent.trim() === text);
  const first = (...actions) => actions.find((action) => action !== null && action !== undefined) || null;
  const $1 = (selector) => document.querySelector(selector);
  const submit = () => click($1('#subbtn'));

  // Checkbox pages ("Select a, b and click Submit." or "Select nothing ..."): toggle each box that is not
  // as asked, then submit.
  const checkboxes = () => {
    const names = utterance().replace(/^Select /, '').replace(/ and click Submit\.$/, '');
    const wanted = names === 'nothing' ? [] : names.split(', ');
    const wrong = all('#area input[type=checkbox]').find((box) => box.checked !== wanted.includes(box.parentNode.textContent.trim()));
    return first(click(wrong), submit());
  };
  // Accordion (click-collapsible-2) and tab (click-tab-2) pages: the link "text" hides in a closed
  // section; open the section that holds one (opener(panel) is its header or tab), then click the link.
  const hiddenLink = (opener) => {
    if (animating()) return wait();
    const links = all('#area .alink').filter((link) => link.innerHTML === quoted()[0]);
    const open = links.find(shown);
    return open ? click(open) : click(opener(links[0]));
  };
  // A text field's answer, then submit (read-table, find-word, the arithmetic pages...).
  const answer = (field, text, button = '#subbtn') => first(fill($1(field), text), click($1(button)));

  const SOLVERS = {
    // -- buttons, links, boxes, tabs and dialogs
    'click-button': () => click(byText('#area button', quoted()[0])),
    'click-button-sequence': () => click($1(buttonsPushed.length === 0 ? '#subbtn' : '#subbtn2')),
    'click-checkboxes': checkboxes,
    'click-checkboxes-large': checkboxes,
    'click-checkboxes-transfer': checkboxes,
    'click-collapsible': () => {
      if (animating()) return wait();
      return all('.ui-accordion-content').some(shown) ? submit() : click($1('#area h3'));
    },
    'click-collapsible-2': () => hiddenLink((link) => link.closest('.ui-accordion-content').previousElementSibling),
    'click-dialog': () => click($1('.ui-dialog-titlebar-close')),
    'click-dialog-2': () => {
      const label = quoted()[0];
      return click(label === 'x' ? $1('.ui-dialog-titlebar-close') : byText('.ui-dialog-buttonpane button', label));
    },
    'click-link': () => click(byText('#area .alink', quoted()[0])),
    'click-option': () => {
      const label = utterance().replace(/^Select /, '').replace(/ and click Submit\.$/, '');
      const radio = all('#area input[type=radio]').find((el) => el.parentNode.textContent.trim() === label);
      return radio.checked ? submit() : click(radio);
    },
    'click-tab': () => click($1(`#area ul a[href="#tabs-${utterance().match(/Tab #(\d)/)[1]}"]`)),
    'click-tab-2': () => hiddenLink((link) => $1(`#area ul a[href="#${link.closest('.ui-tabs-panel').id}"]`)),
    'click-test': () => submit(),
    'click-test-2': () => submit(),
    'click-widget': () => click(all('#area .widget [data-type]').find((el) => el.dataset.type === quoted()[0])),

    // -- text fields and forms
    'focus-text': () => click($1('#tt')),
    'focus-text-2': () => click($1('#tt' + (['1st', '2nd', '3rd'].indexOf(utterance().match(/the (\w+) input/)[1]) + 1))),
    'enter-text': () => answer('#tt', quoted()[0]),
    'enter-text-2': () => {
      const text = quoted()[0];
      return answer('#tt', utterance().includes('all upper case') ? text.toUpperCase() : text.toLowerCase());
    },
    'enter-password': () => {
      const password = quoted()[0];
      return first(fill($1('#password'), password), fill($1('#verify'), password), submit());
    },
    'login-user': () => {
      const [user, password] = quoted();
      return first(fill($1('#username'), user), fill($1('#password'), password), submit());
    },
    'enter-date': () => {  // "Enter 10/20/2017": the date field takes month, day and year typed from its month part
      const [month, day, year] = $1('#query .bold').textContent.split('/');
      const field = $1('#tt');
      return field.value === `${year}-${month}-${day}` ? submit() : writeAt(field, month + day + year, 8);
    },
    'enter-time': () => {  // "Enter 7:55 PM as the time": the time field takes hours, minutes and A/P from its hour part
      const [, hours, minutes, half] = utterance().match(/Enter (\d+):(\d+) (AM|PM)/);
      const hours24 = (Number(hours) % 12) + (half === 'PM' ? 12 : 0);
      const field = $1('#tt');
      if (field.value === `${String(hours24).padStart(2, '0')}:${minutes}`) return submit();
      return writeAt(field, hours.padStart(2, '0') + minutes + half[0], 10);
    },

    // -- read the page, then click or answer in a field
    // The cards are face down: turn them over from the left until the greatest shows, then submit.
    'find-greatest': () => {
      const cards = all('#cardholder .card');
      const values = cards.map((card) => Number(card.querySelector('.card-value').textContent));
      const best = values.indexOf(Math.max(...values));
      const up = cards.findIndex((card) => !card.classList.contains('hidden'));
      if (up === best) return click($1('#submit'));
      return click(cards[up === -1 ? 0 : (up < best ? up + 1 : best)]);
    },
    'click-color': () => click($1(`#area .color[data-color="${utterance().match(/Click on the (.+) colored box/)[1]}"]`)),
    'grid-coordinate': () => click(document.getElementById($1('#query .bold').textContent)),
    'unicode-test': () => click(byText('#area button', quoted()[0])),
    'odd-or-even': () => {
      const unmarked = all('#numbers .row').map((row) => {
        const odd = Math.abs(parseInt(row.querySelector('.display-number').textContent, 10)) % 2 === 1;
        return row.querySelector(odd ? '.odd' : '.even');
      }).find((button) => !button.classList.contains('selected'));
      return first(click(unmarked), click($1('#submit')));
    },
    'read-table': () => {
      const key = byText('#tab td', $1('#query .bold').textContent);
      return answer('#tt', key.nextElementSibling.textContent);
    },
    'find-word': () => {
      const words = $1('#area p').textContent.trim().split(/\s+/);
      return answer('#answer-input', words[parseInt($1('#query .bold').textContent, 10) - 1].replace(/[^a-zA-Z]/g, ''));
    },
    'text-transform': () => answer('#tt', all('#captcha span').map((span) => span.textContent).join('')),
    'simple-arithmetic': () => {
      const [, a, op, b] = $1('#math-problem').textContent.match(/(-?\d+) ([-+x]) (-?\d+)/);
      const value = op === '+' ? +a + +b : op === '-' ? a - b : a * b;
      return answer('#math-answer', String(value));
    },
    'simple-algebra': () => {  // "x + 3 = 40", "x - 3 = 40" or "3 - x = 40"
      const problem = $1('#math-problem').textContent;
      const [, a, op, b, c] = problem.match(/(x|\d+) ([-+]) (x|\d+) = (-?\d+)/);
      const digit = Number(a === 'x' ? b : a), total = Number(c);
      const x = op === '+' ? total - digit : (a === 'x' ? total + digit : digit - total);
      return answer('#math-answer', String(x));
    },

    // -- widgets that take the keyboard, the wheel, a drag or a hover
    // Type the start of the item, then pick it from the suggestions with the arrow keys.
    'use-autocomplete': () => {
      const [start, end] = quoted();
      const fits = (text) => text.startsWith(start) && (end === undefined || text.endsWith(end));
      const field = $1('#tags');
      const items = all('.ui-autocomplete .ui-menu-item').filter(shown);
      if (fits(field.value) && ITEMS.includes(field.value) && items.length === 0) return submit();
      const index = items.findIndex((item) => fits(item.textContent));
      if (index >= 0) return press(...Array(index + 1).fill('ArrowDown'), 'Enter');
      if (field.value === start) return wait();  // the suggestions come after a short delay
      return write(field, start);
    },
    // Open the select, move to the option with the arrow keys and take it with Enter, submit.
    'choose-list': () => {
      const select = $1('#options'), option = utterance().match(/^Select (.+) from the list/)[1];
      const target = Array.from(select.options).findIndex((el) => el.textContent === option);
      if (select.selectedIndex === target) return click($1('#area button'));
      if (document.activeElement !== select) return click(select);
      const moves = target - select.selectedIndex;
      return press(...Array(Math.abs(moves)).fill(moves > 0 ? 'ArrowDown' : 'ArrowUp'), 'Enter');
    },
    // Open the folders above the file (outermost first), then click it.
    'navigate-tree': () => {
      const targets = all('#tree span').filter((span) => span.textContent === quoted()[0]);
      const open = targets.find(shown);
      if (open) return click(open);
      const closed = [];
      for (let li = targets[0].parentNode.parentNode.closest('li'); li; li = li.parentNode.closest('li')) closed.push(li);
      return click(closed.reverse().find((li) => !shown(li.querySelector(':scope > ul'))).querySelector(':scope > span'));
    },
    // Open the menu, hover the submenu's parent (Playback) if the item is in it, click the item.
    'click-menu-2': () => {
      const icon = $1('#query .ui-icon');
      const item = icon ? $1(`#menu .${icon.classList[1]}`).closest('li')
                        : all('#menu li').find((li) => li.children[0].textContent === quoted()[1]);
      if (!shown($1('#menu'))) return click($1('#open-menu'));
      if (shown(item)) return animating() ? wait() : click(item.children[0]);
      const parent = item.parentNode.closest('li');
      return parent.children[0].classList.contains('ui-state-active') ? wait() : hover(parent.children[0]);
    },
    // Drag the small box onto the middle of the large one.
    'drag-box': () => {
      if (smallBoxContained()) return submit();
      const from = point($1('#draggableSmall')), to = center($1('#draggableLarge'));
      return {tool: 'drag', args: {x: from.x, y: from.y, to_x: to.x, to_y: to.y}};
    },
    // Drag the handle near the value, then correct it with the arrow keys (the drag leaves it focused).
    'use-slider': () => {
      const slider = $('#slider'), handle = $1('#slider .ui-slider-handle');
      const target = Number(utterance().match(/Select (-?\d+) with/)[1]), value = slider.slider('value');
      if (value === target) return submit();
      if (document.activeElement === handle) {
        return press(...Array(Math.abs(target - value)).fill(target > value ? 'ArrowRight' : 'ArrowLeft'));
      }
      const min = slider.slider('option', 'min'), max = slider.slider('option', 'max');
      const fraction = (target - min) / (max - min), r = $1('#slider').getBoundingClientRect(), from = center(handle);
      const to = slider.slider('option', 'orientation') === 'horizontal'
        ? {to_x: Math.round(r.left + fraction * r.width), to_y: from.y}
        : {to_x: from.x, to_y: Math.round(r.bottom - fraction * r.height)};
      return {tool: 'drag', args: {...from, ...to}};
    },
    // The last word is at the end of a scrolling text area: scroll it down, type the word, submit.
    'scroll-text': () => {
      const area = $1('#text-area');
      const words = area.value.split(/\s/g), word = words[words.length - 1].replace('.', '');
      const field = $1('#answer-input');
      return field.value === word ? submit() : first(scrollDown(area), write(field, word));
    },
    // The name field and Agree unlock once the agreement is scrolled to its end.
    'sign-agreement': () => {
      if (utterance() === 'Click the cancel button.') return click($1('#cancel'));
      const [name, button] = quoted();
      if ($1('#name').disabled) return scrollDown($1('#text-area')) || wait();
      return first(fill($1('#name'), name), click($1(button === 'Agree' ? '#agree' : '#cancel')));
    },
    // Copy and paste with the keyboard: select all in the text area and copy, then paste into the field.
    'copy-paste': () => {
      const area = $1('#to-copy'), field = $1('#answer-input');
      if (field.value === area.value) return submit();
      const copied = area.selectionStart === 0 && area.selectionEnd === area.value.length;
      if (document.activeElement === field && copied) return press('Control+A', 'Control+V');
      if (document.activeElement === area && !copied) return press('Control+A', 'Control+C');
      return click(copied ? field : area);
    },
  };
  const solver = SOLVERS[name];
  if (solver === undefined) throw new Error('the oracle has no solver for ' + name);
  return solver();
}
