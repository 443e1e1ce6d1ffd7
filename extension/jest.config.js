// jest for the renderer and the workers status item, in jsdom (JupyterLab's own test setup).
const jestJupyterLab = require('@jupyterlab/testutils/lib/jest-config');

// JupyterLab ships ES modules; jest must transform them too.
const esModules = [
  '@codemirror',
  '@jupyter/',
  '@microsoft/',
  'exenv-es6',
  '@jupyterlab/',
  'lib0',
  'nanoid',
  'vscode-ws-jsonrpc',
  'y-protocols',
  'y-websocket',
  'yjs'
].join('|');

const baseConfig = jestJupyterLab(__dirname);

module.exports = {
  ...baseConfig,
  automock: false,
  testRegex: 'src/__tests__/.*\\.spec\\.ts$',
  transformIgnorePatterns: [`/node_modules/(?!${esModules}).+`],
  // The built labextension has a package.json named "nbaccel" too: keep jest's module map unique.
  modulePathIgnorePatterns: ['<rootDir>/../nbaccel/labextension', '<rootDir>/lib']
};
